// kvviz offline page. Every text from the model or the user is set with textContent, never as markup; the page makes
// no request (its Content-Security-Policy forbids any). Data: the JSON in #kvviz-data (see kvviz/figures/standalone_page.py).
// The strip is drawn by kvviz/figures/strip.js, the strip's one front end, inlined before these lines, from rows of
// the shape kvviz.view_data.strip_chips gives the dashboard.
const DATA = JSON.parse(document.getElementById("kvviz-data").textContent);
const SEGMENTS = KV_SEGMENTS;
const n = DATA.slots.length;
const state = { view: 0, at: n - 1, edit: DATA.prepared.length ? 0 : -1 };

function floats(base64) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  return new Float32Array(bytes.buffer);
}
const VIEWS = DATA.views.map((v) => ({ ...v, weights: floats(v.weights) }));

function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "text") node.textContent = value;
    else if (key === "className") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.appendChild(child);
  return node;
}

function row(view, at) {  // the step's attention over slots 0..at
  const start = (at * (at + 1)) / 2;
  return view.weights.subarray(start, start + at + 1);
}

function fmt(x, digits = 4) { return Number(x).toPrecision(digits); }

const app = document.getElementById("app");
app.appendChild(el("h1", { text: DATA.title }));
app.appendChild(el("p", { className: "kv-note", text: `${DATA.model} · ${n} cached slots · an offline replay ` +
  "(no server): the attention of every step and the what-if results of the prepared edits, as the model computed them" }));

const conversation = el("div", { className: "kv-conversation" });
DATA.turns.forEach((turn, i) => {
  conversation.appendChild(el("div", { className: "kv-user" }, [el("b", { text: `Turn ${i + 1} · user: ` }),
    el("span", { text: turn.user })]));
  conversation.appendChild(el("div", { className: "kv-assistant" }, [el("b", { text: "assistant: " }),
    el("span", { text: turn.assistant })]));
});
app.appendChild(conversation);

const controls = el("div", { className: "kv-controls" });
const viewSelect = el("select", { "aria-label": "Attention of" });
VIEWS.forEach((v, i) => viewSelect.appendChild(el("option", { value: String(i),
  text: `layer ${v.layer}, ${v.head === null ? "mean of heads" : "head " + v.head}` })));
const slider = el("input", { type: "range", min: "0", max: String(n - 1), value: String(n - 1), "aria-label": "Step" });
const stepLabel = el("span", { className: "kv-step" });
const play = el("button", { type: "button", className: "kv-play", text: "▶ Play the growth" });
controls.append(el("label", { text: "Attention of " }), viewSelect, el("label", { text: " · step " }), slider, stepLabel,
  play);
app.appendChild(controls);

const editList = el("div", { className: "kv-edits", role: "list" });
app.appendChild(el("h2", { text: "Prepared edits" }));
app.appendChild(DATA.prepared.length ? editList : el("p", { text: "No edit was prepared for this page." }));
DATA.prepared.forEach((p, i) => {
  const button = el("button", { type: "button", text: `${i + 1}. ${p.label} @ slot ${p.at}` });
  button.addEventListener("click", () => choose(i));
  editList.appendChild(button);
});

const strip = el("div", { className: "kv-strip", role: "list" });
app.appendChild(el("h2", { text: "The cache" }));
app.appendChild(el("p", { className: "kv-note", text: "Background: attention of the step (dashed outline) · band: " +
  "grey history, blue query, orange generated · struck through: evicted by the chosen edit · badge: its bits · click a " +
  "chip of a prepared edit to show that edit" }));
app.appendChild(strip);
const notice = el("p", { className: "kv-notice", role: "status" });
app.appendChild(notice);
kvOnChipClick(strip, (slot) => {
  const covering = DATA.prepared.map((p, i) => [p, i]).filter(([p]) => p.evicted.includes(slot) ||
    slot in p.key_bits || slot in p.value_bits).map(([, i]) => i);
  if (!covering.length) { notice.textContent = `No prepared edit touches slot ${slot}.`; return; }
  const next = covering.find((i) => i > state.edit);  // clicking again cycles through the edits that touch it
  choose(next === undefined ? covering[0] : next);
});

const result = el("div", { className: "kv-result" });
app.appendChild(result);

function choose(index) {
  stopPlaying();
  state.edit = index;
  state.at = DATA.prepared[index].at;
  slider.value = String(state.at);
  notice.textContent = "";
  draw();
}
viewSelect.addEventListener("change", () => { state.view = Number(viewSelect.value); draw(); });
slider.addEventListener("input", () => { stopPlaying(); state.at = Number(slider.value); draw(); });

// The growth as an animation: from the first slot to the last, the slots not yet cached hidden, about 8 s in all
let timer = null;
function stopPlaying() {
  if (timer !== null) clearInterval(timer);
  timer = null;
  strip.classList.remove("kv-growing");
  play.textContent = "▶ Play the growth";
}
play.addEventListener("click", () => {
  if (timer !== null) { stopPlaying(); return; }
  strip.classList.add("kv-growing");
  play.textContent = "■ Stop";
  state.edit = -1;
  state.at = 0;
  const stride = Math.max(1, Math.round(n / 160));  // at most ~160 frames, each long enough to follow: ~8 s in all
  const every = Math.max(50, 8000 / Math.ceil(n / stride));
  timer = setInterval(() => {
    state.at = Math.min(state.at + stride, n - 1);
    slider.value = String(state.at);
    draw();
    if (state.at >= n - 1) { clearInterval(timer); timer = null; play.textContent = "▶ Play the growth"; }
  }, every);
});

function table(rows, caption) {
  const head = el("tr", {}, ["token", "p", "rank", "rank other", "Δlogit"].map((h) => el("th", { text: h })));
  const body = rows.map(([text, p, rank, other, delta]) => el("tr", {}, [
    el("td", { text }), el("td", { text: fmt(p) }), el("td", { text: String(rank) }),
    el("td", { text: String(other) }), el("td", { text: (delta >= 0 ? "+" : "") + Number(delta).toFixed(4) })]));
  return el("table", {}, [el("caption", { text: caption }), head, ...body]);
}

function bars(alpha, renorm, used) {  // α, α′ and the edited run's weights of the detail head, per slot
  const width = 900, height = 160, w = width / alpha.length;
  const top = Math.max(...alpha, ...renorm, ...used, 1e-9);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "kv-bars");
  const bar = (x, value, colour, offset) => {
    const rect = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const h = (Math.max(value, 0) / top) * (height - 10);
    rect.setAttribute("x", String(x * w + offset * w / 3));
    rect.setAttribute("y", String(height - h));
    rect.setAttribute("width", String(Math.max(w / 3 - 0.2, 0.3)));
    rect.setAttribute("height", String(h));
    rect.setAttribute("fill", colour);
    svg.appendChild(rect);
  };
  alpha.forEach((a, slot) => { bar(slot, a, "#7f8c9a", 0); bar(slot, renorm[slot], "#2f80ed", 1);
    bar(slot, used[slot], "#f2994a", 2); });
  return svg;
}

function draw() {
  const view = VIEWS[state.view], at = state.at, weights = row(view, at);
  const top = Math.max(...weights, 1e-12);
  const edit = state.edit >= 0 ? DATA.prepared[state.edit] : null;
  const evicted = new Set(edit ? edit.evicted : []);
  stepLabel.textContent = ` slot ${at} (${SEGMENTS[DATA.slots[at][1]]})`;
  // the strip's rows (kvviz.view_data.strip_chips' columns): the step's attention relative to its strongest slot, the
  // chosen edit's evictions and bits; a slot after the step is drawn faint
  const rows = DATA.slots.map(([text, segment, turn], slot) => [slot, text, segment, turn,
    slot <= at ? Math.round(weights[slot] / top * 1e4) / 1e4 : 0, evicted.has(slot) ? 1 : 0,
    (edit && edit.key_bits[slot]) || 16, (edit && edit.value_bits[slot]) || 16, 0, 0, 0, 0, 16, 16, 0, 0, 0, ""]);
  kvDrawStrip(strip, rows, at);
  kvDrawSink(strip, DATA.sinks ? { share: 1 - weights.slice(0, at + 1).reduce((a, b) => a + b, 0),
    layer: view.layer, head: view.head === null ? "the mean of heads" : "head " + view.head } : null);
  strip.kvDrawn.forEach(({ chip, row }) => chip.classList.toggle("kv-later", row[0] > at));
  [...editList.children].forEach((b, i) => b.classList.toggle("kv-chosen", i === state.edit));
  result.replaceChildren();
  if (!edit) return;
  result.appendChild(el("h2", { text: `What-if: ${edit.label} at slot ${edit.at}` }));
  const metrics = [["KL(full‖edited), nats", fmt(edit.kl, 3)], ["Total variation", fmt(edit.tv, 3)],
    ["Top-1", edit.top1_changed ? "FLIPS" : "unchanged"], [`ρ (layer ${edit.layer}, head ${edit.head})`, fmt(edit.rho)],
    ["Cache bytes", `${edit.bytes[0].toLocaleString("en")} of ${edit.bytes[1].toLocaleString("en")}`]];
  result.appendChild(el("div", { className: "kv-metrics" }, metrics.map(([label, value]) =>
    el("div", { className: "kv-metric" }, [el("div", { text: label }), el("strong", { text: value })]))));
  result.appendChild(el("div", { className: "kv-tables" }, [table(edit.full, "Full cache: next token"),
    table(edit.edited, "Edited cache: next token")]));
  if (edit.continuation) {  // what the edit does to the reply, not only to the next token
    const cont = edit.continuation;
    result.appendChild(el("h3", { text: `Greedy continuations (${cont.parting})` }));
    result.appendChild(el("div", { className: "kv-tables" }, [["full cache", cont.full], ["edited cache", cont.edited]]
      .map(([caption, text]) => el("div", { className: "kv-continuation" }, [el("div", { className: "kv-note",
        text: caption }), el("pre", { text })]))));
  }
  result.appendChild(el("p", { className: "kv-note", text: `α (grey), α′ = α/(1−ρ) (blue) and the weights the ` +
    `edited run used (orange), layer ${edit.layer}, head ${edit.head}, over slots 0..${edit.at}; evicted slots: 0` }));
  result.appendChild(bars(edit.alpha, edit.renorm, edit.used));
}
draw();
