// The dashboard's host of the cache strip: kvviz/figures/strip.js (the one front end, loaded before these lines)
// draws the chips and the minimap; here the Streamlit component receives rows and reports clicks. Python holds the
// state; a click sends {slot, shift, nonce}.

function decoded(data) {
  // the page sends one JSON byte string (see strip.py)
  if (data instanceof ArrayBuffer || ArrayBuffer.isView(data)) return JSON.parse(new TextDecoder().decode(data));
  return data;
}

export default function (component) {
  const { parentElement, setTriggerValue } = component;
  const data = decoded(component.data);
  let root = parentElement.querySelector(".kv-strip");
  let minimap = parentElement.querySelector(".kv-minimap");
  if (!root) {
    minimap = document.createElement("canvas");
    minimap.className = "kv-minimap";
    minimap.title = "The whole cache: click to scroll the strip there";
    parentElement.appendChild(minimap);
    minimap.addEventListener("click", (event) => {
      const chips = root.kvChips || [];
      const rect = minimap.getBoundingClientRect();
      const index = Math.floor((event.clientX - rect.left) / rect.width * chips.length);
      if (chips[index]) kvScrollToChip(root, kvChipAt(root, chips[index][0]));
    });
    root = document.createElement("div");
    root.className = "kv-strip";
    parentElement.appendChild(root);
    kvOnChipClick(root, (slot, shift) => setTriggerValue("click", { slot, shift, nonce: Date.now() + Math.random() }));
  }
  const chips = (data && data.chips) || [];
  const at = data ? data.at : -1;
  const found = (data && data.found) || [];
  const fresh = kvDrawStrip(root, chips, at);
  kvDrawSink(root, data ? data.sink : null);
  root.classList.toggle("kv-large", Boolean(data && data.large));
  const search = JSON.stringify(found), hits = new Set(found);
  if (fresh || search !== root.kvSearch) {  // a new search or strip: every chip's mark
    root.kvDrawn.forEach(({ chip }, index) => chip.classList.toggle("kv-found", hits.has(chips[index][0])));
  } else if (found.length) {  // kvDescribe reset the classes of the chips it updated: mark the hits again
    chips.forEach((row, index) => { if (hits.has(row[0])) root.kvDrawn[index].chip.classList.add("kv-found"); });
  }
  const focus = data && data.focus !== undefined ? data.focus : null;
  if (search !== root.kvSearch && found.length) {
    kvScrollToChip(root, kvChipAt(root, found[0]));  // a new search: its first hit
  } else if (focus !== null && (fresh || focus !== root.kvFocus)) {
    kvScrollToChip(root, kvChipAt(root, focus));  // what a tour step's caption names
  } else if (fresh) {
    kvScrollToChip(root, root.querySelector(".kv-current"));  // a new step or conversation: the step in view
  }
  root.kvSearch = search;
  root.kvFocus = focus;
  root.kvChips = chips;
  kvDrawMinimap(minimap, root, chips, at, found);
  if (!root.kvScrollHooked) {
    root.addEventListener("scroll",
      () => kvDrawMinimap(minimap, root, root.kvChips || [], root.kvAt, root.kvFound || []));
    root.kvScrollHooked = true;
  }
  root.kvFound = found;
}
