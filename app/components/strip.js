// The clickable cache strip. Every chip's text is set with textContent (never innerHTML): model and user text
// can contain markup, and it must show literally. Python holds the state; a click sends {slot, shift, nonce}.
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
  const segments = ["history", "query", "generated"];
  const fragment = document.createDocumentFragment();
  let turn = null;
  for (const [slot, text, segment, chipTurn, attention, evicted, keyBits, valueBits, selected] of chips) {
    if (turn !== null && chipTurn !== turn) {
      const separator = document.createElement("span");
      separator.className = "kv-turn";
      separator.textContent = "turn " + chipTurn;
      fragment.appendChild(separator);
    }
    turn = chipTurn;
    const chip = document.createElement("span");
    chip.className = "kv-chip kv-" + segments[segment] + (evicted === 1 ? " kv-evicted" : "") +
      (evicted === 2 ? " kv-partial" : "") + (selected ? " kv-selected" : "") + (slot === data.at ? " kv-current" : "");
    chip.dataset.slot = slot;
    chip.setAttribute("role", "listitem");
    chip.style.setProperty("--kv-attention", String(attention));
    chip.title = "slot " + slot + " · " + segments[segment] + " · turn " + chipTurn + " · attention " +
      attention.toFixed(3) + " of max" + (keyBits < 16 || valueBits < 16 ? " · K" + keyBits + "/V" + valueBits : "");
    chip.textContent = text.replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅";
    if (keyBits < 16 || valueBits < 16) {
      const badge = document.createElement("sup");
      badge.className = "kv-bits";
      badge.textContent = keyBits === valueBits ? String(keyBits) : keyBits + "/" + valueBits;
      chip.appendChild(badge);
    }
    fragment.appendChild(chip);
  }
  root.replaceChildren(fragment);
  root.classList.toggle("kv-large", Boolean(data && data.large));
}
