// kvviz's notebook widget (anywidget): the strip of a session at one step, its controls, and the what-if the kernel
// computes for the edit being tried. The strip is drawn by kvviz/figures/strip.js, the strip's one front end, loaded
// before these lines (kvviz/figures/strip.py); the rows are kvviz.view_data.strip_chips', as the dashboard's. Text
// is set as text; the what-if's HTML is the kernel's own escaped rendering.

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function select(label, options, value, onChange) {
  const wrap = el("label", "kvviz-field", label + " ");
  const box = el("select");
  for (const [v, text] of options) {
    const option = el("option", "", text);
    option.value = String(v);
    box.appendChild(option);
  }
  box.value = String(value);
  box.addEventListener("change", () => onChange(box.value));
  wrap.appendChild(box);
  return [wrap, box];
}

function render({ model, el: root }) {
  root.classList.add("kvviz-widget");
  // a click or a button reaches the kernel as the `request` trait (counted, so a repeated click is a change too)
  const request = (action) => {
    model.set("request", { ...action, n: (model.get("request").n || 0) + 1 });
    model.save_changes();
  };
  const bar = el("div", "kvviz-bar");
  const stepLabel = el("label", "kvviz-field", "step ");
  const step = el("input");
  step.type = "range";
  step.min = "0";
  const stepText = el("span", "kvviz-step-text");
  stepLabel.append(step, stepText);
  step.addEventListener("change", () => { model.set("at", Number(step.value)); model.save_changes(); });
  step.addEventListener("input", () => { stepText.textContent = "slot " + step.value; });

  const range = (n) => Array.from({ length: n }, (_, i) => [i, String(i)]);
  const [layerField, layerBox] = select("layer", range(model.get("layers")), model.get("layer"),
    (v) => { model.set("layer", Number(v)); model.save_changes(); });
  const [headField, headBox] = select("head", [[-1, "mean"], ...range(model.get("heads"))], model.get("head"),
    (v) => { model.set("head", Number(v)); model.save_changes(); });
  const [scopeField, scopeBox] = select("evict in", [["everywhere", "every layer"], ["layer", "this layer"],
    ["kv head", "this layer's KV head"]], model.get("scope"),
    (v) => { model.set("scope", v); model.save_changes(); });
  bar.append(stepLabel, layerField, headField, scopeField);

  const tools = el("div", "kvviz-bar");
  tools.appendChild(el("span", "kvviz-note", "selection:"));
  for (const bits of [2, 4, 8, 16]) {
    const button = el("button", "kvviz-button", bits === 16 ? "16 (undo bits)" : bits + " bits");
    button.addEventListener("click", () => request({ kind: "bits", bits }));
    tools.appendChild(button);
  }
  for (const [kind, text] of [["clear", "Clear"], ["commit", "Commit"], ["undo", "Undo"]]) {
    const button = el("button", "kvviz-button kvviz-" + kind, text);
    button.addEventListener("click", () => request({ kind }));
    tools.appendChild(button);
  }
  const commits = el("span", "kvviz-note");
  tools.appendChild(commits);

  const help = el("div", "kvviz-note",
    "click a chip: evict it · shift-click: select it for a bit-width · shade: attention of the step's token");
  const strip = el("div", "kv-strip");
  kvOnChipClick(strip, (slot, shift) => request({ kind: shift ? "select" : "evict", slot }));
  const status = el("div", "kvviz-status");
  const error = el("div", "kvviz-error");
  const result = el("div", "kvviz-result");
  root.append(bar, tools, help, strip, status, error, result);

  function drawStrip() {
    kvDrawStrip(strip, model.get("chips"), model.get("at"));
    kvDrawSink(strip, model.get("sink"));
  }
  function drawSettings() {
    const slots = model.get("slots");
    step.max = String(Math.max(slots - 1, 0));
    step.value = String(model.get("at"));
    stepText.textContent = "slot " + model.get("at") + " of " + Math.max(slots - 1, 0);
    layerBox.value = String(model.get("layer"));
    headBox.value = String(model.get("head"));
    scopeBox.value = model.get("scope");
    commits.textContent = model.get("commits") + " committed edit(s)";
  }
  function drawStatus() {
    const progress = model.get("progress");
    const kl = model.get("kl");
    const number = kl === null ? "" : kl > 0 && kl < 1e-3 ? kl.toExponential(3) : kl.toPrecision(4);
    status.textContent = progress ? progress : model.get("busy") ? "computing the what-if…" :
      kl === null ? "nothing edited: click a chip" : "KL(full ‖ edited) = " + number + " nats";
    status.dataset.kl = kl === null ? "" : String(kl);
    error.textContent = model.get("error");
    result.innerHTML = model.get("result_html");
  }
  drawStrip();
  drawSettings();
  drawStatus();
  model.on("change:chips", drawStrip);
  model.on("change:sink", drawStrip);
  for (const name of ["slots", "at", "layer", "head", "scope", "commits"]) model.on("change:" + name, drawSettings);
  for (const name of ["kl", "error", "result_html", "busy", "progress"]) model.on("change:" + name, drawStatus);
}

export default { render };
