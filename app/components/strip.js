// The clickable cache strip. Every chip's text is set with textContent (never innerHTML): model and user text
// can contain markup, and it must show literally. Python holds the state; a click sends {slot, shift, nonce}.
// A click changes one or two chips: when the slots and their texts are as last drawn, chips are updated in place
// (only those whose row changed), so a long strip is not rebuilt (and laid out again) on every click.
const SEGMENTS = ["history", "query", "generated"];

function describe(chip, row, at) {
  const [slot, text, segment, turn, attention, evicted, keyBits, valueBits, selected, typed, outside,
         gone, committedKeyBits, committedValueBits, draftPairs, committedPairs] = row;
  chip.className = "kv-chip kv-" + SEGMENTS[segment] + (evicted === 1 ? " kv-evicted" : "") +
    (evicted === 2 ? " kv-partial" : "") + (selected ? " kv-selected" : "") + (slot === at ? " kv-current" : "") +
    (typed ? " kv-typed" : "") + (outside ? " kv-outside" : "") + (gone === 1 ? " kv-committed" : "") +
    (gone === 2 ? " kv-committed-partial" : "");
  chip.style.setProperty("--kv-attention", String(attention));
  const quantized = keyBits < 16 || valueBits < 16;
  const committedBits = committedKeyBits < 16 || committedValueBits < 16;
  chip.title = "slot " + slot + " · " + SEGMENTS[segment] + " · turn " + turn + " · attention " +
    attention.toFixed(3) + " of max" + (quantized ? " · trying K" + keyBits + "/V" + valueBits : "") +
    (evicted === 2 ? " · trying: evicted in " + draftPairs + " of the (layer, KV head) pairs" : "") +
    (gone === 1 ? " · committed: evicted" : "") +
    (gone === 2 ? " · committed: evicted in " + committedPairs + " of the (layer, KV head) pairs" : "") +
    (committedBits ? " · committed: K" + committedKeyBits + "/V" + committedValueBits : "") +
    (typed ? " · a control token typed by the user" : "") +
    (outside ? " · outside this layer's sliding window: the layer no longer holds it" : "");
  chip.textContent = text.replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅";
  const badge = (className, k, v) => {
    const sup = document.createElement("sup");
    sup.className = className;
    sup.textContent = k === v ? String(k) : k + "/" + v;
    chip.appendChild(sup);
  };
  if (committedBits) badge("kv-bits kv-bits-committed", committedKeyBits, committedValueBits);
  if (quantized) badge("kv-bits", keyBits, valueBits);
}

function rebuild(root, chips, at) {
  const fragment = document.createDocumentFragment();
  const drawn = [];
  let turn = null;
  for (const row of chips) {
    if (turn !== null && row[3] !== turn) {
      const separator = document.createElement("span");
      separator.className = "kv-turn";
      separator.textContent = "turn " + row[3];
      fragment.appendChild(separator);
    }
    turn = row[3];
    const chip = document.createElement("span");
    chip.dataset.slot = row[0];
    chip.setAttribute("role", "listitem");
    describe(chip, row, at);
    fragment.appendChild(chip);
    drawn.push({ chip, key: JSON.stringify(row) });
  }
  root.replaceChildren(fragment);
  return drawn;
}

export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  let root = parentElement.querySelector(".kv-strip");
  if (!root) {
    root = document.createElement("div");
    root.className = "kv-strip";
    root.setAttribute("role", "list");
    parentElement.appendChild(root);
    root.addEventListener("click", (event) => {
      const chip = event.target.closest(".kv-chip");
      if (!chip) return;
      setTriggerValue("click", { slot: Number(chip.dataset.slot), shift: event.shiftKey || event.altKey || event.metaKey,
                                 nonce: Date.now() + Math.random() });
    });
  }
  const chips = (data && data.chips) || [];
  const at = data ? data.at : -1;
  const layout = JSON.stringify(chips.map((row) => [row[0], row[1], row[3]]));  // slots, texts and turns
  if (root.kvLayout === layout && root.kvAt === at) {
    chips.forEach((row, index) => {
      const key = JSON.stringify(row);
      const drawn = root.kvDrawn[index];
      if (drawn.key !== key) {
        describe(drawn.chip, row, at);
        drawn.key = key;
      }
    });
  } else {
    root.kvDrawn = rebuild(root, chips, at);
    root.kvLayout = layout;
    root.kvAt = at;
  }
  root.classList.toggle("kv-large", Boolean(data && data.large));
}
