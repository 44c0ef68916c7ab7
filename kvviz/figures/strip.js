// The cache strip's one front end, loaded by every host that draws it: the dashboard's component
// (app/components/strip.js), the notebook widget (kvviz/notebook/widget.js) and the offline page
// (kvviz/figures/standalone_page.js), each of which appends its own few lines to this text (kvviz/figures/strip.py).
// No import or export: the same text runs as a module (Streamlit, anywidget) and as a page's classic script.
//
// A row is kvviz.view_data.strip_chips' list: [slot, text, segment, turn, attention, evicted, keyBits, valueBits,
// selected, typed, outside, gone, committedKeyBits, committedValueBits, draftPairs, committedPairs, late, why,
// unread].
// Every chip's text is set with textContent (never innerHTML): model and user text can contain markup, and it must
// show literally. A redraw with the same slots, texts and turns updates only the chips whose row changed, so a long
// strip is not rebuilt (and laid out again) on every click.
"use strict";
const KV_SEGMENTS = ["history", "query", "generated"];
const KV_MARKS = /(␣+|↵+|⇥+|∅|(?:<0x[0-9A-F]{2}>)+)/;  // kvviz.spelling's marks (a capture: split keeps them)
const KV_SEGMENT_COLOURS = ["#7f8c9a", "#2f80ed", "#f2994a"];

function kvDescribe(chip, row, at) {
  const [slot, text, segment, turn, attention, evicted, keyBits, valueBits, selected, typed, outside,
         gone, committedKeyBits, committedValueBits, draftPairs, committedPairs, late, why, unread] = row;
  chip.className = "kv-chip kv-" + KV_SEGMENTS[segment] + (evicted === 1 ? " kv-evicted" : "") +
    (evicted === 2 ? " kv-partial" : "") + (selected ? " kv-selected" : "") + (slot === at ? " kv-current" : "") +
    (typed ? " kv-typed" : "") + (outside ? " kv-outside" : "") + (late ? " kv-late" : "") +
    (unread ? " kv-unread" : "") +
    (gone === 1 ? " kv-committed" : "") +
    (gone === 2 ? " kv-committed-partial" : "");
  chip.style.setProperty("--kv-attention", String(attention));
  const quantized = keyBits < 16 || valueBits < 16;
  const committedBits = committedKeyBits < 16 || committedValueBits < 16;
  chip.title = "slot " + slot + " · " + KV_SEGMENTS[segment] + " · turn " + (turn + 1) + " · attention " +
    attention.toFixed(3) + " of max" + (quantized ? " · trying K" + keyBits + "/V" + valueBits : "") +
    (evicted === 1 ? " · trying: evicted" : "") +
    (evicted === 2 ? " · trying: evicted in " + draftPairs + " of the (layer, KV head) pairs" : "") +
    (gone === 1 ? " · committed: evicted" : "") +
    (gone === 2 ? " · committed: evicted in " + committedPairs + " of the (layer, KV head) pairs" : "") +
    (committedBits ? " · committed: K" + committedKeyBits + "/V" + committedValueBits : "") +
    (typed ? " · a control token typed by the user" : "") +
    (late ? " · ends turn " + turn + "'s reply: chosen then, cached by turn " + (turn + 1) + "'s prefill" : "") +
    (outside ? " · outside this layer's sliding window: the layer no longer holds it" : "") +
    (unread ? " · not read by this step in this layer: its indexer picked other slots (sparse attention)" : "") +
    (why ? "\n" + why : "");
  chip.textContent = "";  // the text comes spelled (kvviz.spelling): its marks for spaces, breaks and bytes drawn faint
  text.split(KV_MARKS).forEach((part, i) => {
    if (!part) return;
    if (i % 2 === 0) { chip.appendChild(document.createTextNode(part)); return; }
    const mark = document.createElement("span");
    mark.className = "kv-mark";
    mark.textContent = part;
    chip.appendChild(mark);
  });
  const badge = (className, k, v) => {
    const sup = document.createElement("sup");
    sup.className = className;
    sup.textContent = k === v ? String(k) : k + "/" + v;
    chip.appendChild(sup);
  };
  if (committedBits) badge("kv-bits kv-bits-committed", committedKeyBits, committedValueBits);
  if (quantized) badge("kv-bits", keyBits, valueBits);
}

function kvRebuild(root, chips, at) {
  const fragment = document.createDocumentFragment();
  const drawn = [];
  let turn = null;
  for (const row of chips) {
    if (turn !== null && row[3] !== turn && !row[16]) {  // a late end-of-turn stays with the reply it closes
      const separator = document.createElement("span");
      separator.className = "kv-turn";
      separator.textContent = "turn " + (row[3] + 1);  // turns count from 1 on the page
      fragment.appendChild(separator);
    }
    if (!row[16]) turn = row[3];
    const chip = document.createElement("span");
    chip.dataset.slot = row[0];
    chip.setAttribute("role", "listitem");
    kvDescribe(chip, row, at);
    fragment.appendChild(chip);
    drawn.push({ chip, row });
  }
  root.replaceChildren(fragment);
  return drawn;
}

function kvSameRow(a, b) {
  // rows are flat arrays of numbers, strings and booleans
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function kvSameLayout(drawn, chips) {
  // the same slots, texts and turns as drawn: the chips can be updated in place
  if (!drawn || drawn.length !== chips.length) return false;
  for (let i = 0; i < chips.length; i++) {
    const a = drawn[i].row, b = chips[i];
    if (a[0] !== b[0] || a[1] !== b[1] || a[3] !== b[3] || a[16] !== b[16]) return false;
  }
  return true;
}

function kvDrawStrip(root, chips, at) {
  // draw ``chips`` (rows) in ``root`` (a .kv-strip) at the step of slot ``at``: rebuilt when the slots, texts or
  // turns differ from those drawn, else only the chips whose row changed (and the current step's, old and new).
  // Returns whether the step or the conversation is new. ``root.kvDrawn`` keeps each chip with its row.
  root.classList.add("kv-strip");
  root.setAttribute("role", "list");
  const was = root.kvAt, moved = was !== at;
  root.kvAt = at;
  if (!kvSameLayout(root.kvDrawn, chips)) {
    root.kvDrawn = kvRebuild(root, chips, at);
    return true;
  }
  chips.forEach((row, index) => {
    const drawn = root.kvDrawn[index];
    if (!kvSameRow(drawn.row, row) || (moved && (row[0] === at || row[0] === was))) {
      kvDescribe(drawn.chip, row, at);
      drawn.row = row;
    }
  });
  return moved;
}

function kvDrawSink(root, sink) {
  // a model with learned attention sinks (gpt-oss): one chip before slot 0 with the sink's share of the current
  // step's attention (``sink``: {share, layer, head}; null: none). It holds no key or value, so it cannot be clicked
  // to evict; it is not a .kv-chip (rows, clicks and the minimap skip it) and stays first when the chips are rebuilt.
  let chip = root.querySelector(":scope > .kv-sink");
  if (sink === null || sink === undefined) {
    if (chip) chip.remove();
    return;
  }
  if (!chip) {
    chip = document.createElement("span");
    chip.className = "kv-sink";
    chip.setAttribute("role", "listitem");
  }
  if (root.firstChild !== chip) root.prepend(chip);
  chip.style.setProperty("--kv-attention", String(Math.min(1, Math.max(0, sink.share))));
  chip.textContent = "sink " + sink.share.toFixed(3);
  chip.dataset.share = String(sink.share);
  chip.title = "The learned attention sink of layer " + sink.layer + ", " + sink.head + ": the share of this step's " +
    "attention that goes to no slot (a logit with no value in the softmax). Evicting slots leaves it, so its share " +
    "grows with the rest's: α_sink / (1 − ρ)";
}

function kvOnChipClick(root, handler) {
  // ``handler(slot, shift)`` for a click on a chip of ``root`` (shift: a shift-, alt- or meta-click)
  root.addEventListener("click", (event) => {
    const chip = event.target.closest(".kv-chip");
    if (!chip) return;
    handler(Number(chip.dataset.slot), event.shiftKey || event.altKey || event.metaKey);
  });
}

function kvChipAt(root, slot) {
  return root.querySelector('.kv-chip[data-slot="' + slot + '"]');
}

function kvScrollToChip(root, chip) {
  // within the strip only (the page stays where it is): the chip a third of the way down
  if (!chip) return;
  root.scrollTop += chip.getBoundingClientRect().top - root.getBoundingClientRect().top - root.clientHeight / 3;
}

function kvDrawMinimap(canvas, root, chips, at, found) {
  // the whole cache in one bar, one pixel column per slot or per few slots: attention (red, top; the strongest slot
  // of the column), segments (band, bottom), evicted (dark), search hits (yellow), the current step (black) and the
  // part of the strip in view (outline). Drawn as one image and a rectangle per run of equal columns: a fill per
  // slot cost ~20 ms of every click at 8k slots.
  const width = canvas.clientWidth || 600, height = 18, n = chips.length;
  canvas.width = width;
  canvas.height = height;
  const ctx = canvas.getContext("2d");
  if (!n) return;
  const strongest = new Float32Array(width), segment = new Int8Array(width), dark = new Uint8Array(width);
  const hit = new Uint8Array(width), hits = new Set(found);
  chips.forEach((row, i) => {
    const start = Math.floor(i * width / n), end = Math.max(start + 1, Math.floor((i + 1) * width / n));
    for (let x = start; x < end; x++) {
      strongest[x] = Math.max(strongest[x], row[4]);
      segment[x] = row[2];
      if (row[5] === 1 || row[11] === 1) dark[x] = 1;
      if (hits.has(row[0])) hit[x] = 1;
    }
  });
  const image = ctx.createImageData(width, 12), pixels = image.data;
  for (let x = 0; x < width; x++) {
    const alpha = Math.round(strongest[x] * 0.9 * 255);
    for (let o = x * 4; o < pixels.length; o += width * 4) {
      pixels[o] = 235;
      pixels[o + 1] = 87;
      pixels[o + 2] = 87;
      pixels[o + 3] = alpha;
    }
  }
  ctx.putImageData(image, 0, 0);
  const runs = (values, y, h, colour) => {
    for (let x = 0, end; x < width; x = end) {
      for (end = x + 1; end < width && values[end] === values[x];) end++;
      const fill = colour(values[x]);
      if (fill) {
        ctx.fillStyle = fill;
        ctx.fillRect(x, y, end - x, h);
      }
    }
  };
  runs(segment, 13, 5, (s) => KV_SEGMENT_COLOURS[s]);
  runs(dark, 4, 5, (d) => d && "rgba(40, 40, 40, 0.75)");
  runs(hit, 0, 4, (h) => h && "#f2c94c");
  ctx.fillStyle = "#000";
  ctx.fillRect(Math.floor(Math.min(at, n - 1) * width / n), 0, Math.max(width / n, 2), height);
  const first = root.querySelector(".kv-chip");
  if (first && root.scrollHeight > root.clientHeight) {
    const top = root.scrollTop / root.scrollHeight, seen = root.clientHeight / root.scrollHeight;
    ctx.strokeStyle = "#333";
    ctx.strokeRect(top * width + 0.5, 0.5, Math.max(seen * width, 3), height - 1);
  }
}
