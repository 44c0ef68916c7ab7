"""View data for the dashboard: what the token strip and the attention views draw, as plain lists and arrays.

All tensor work for the app happens here (the app lays out; it does no math). Rows are recomputed on demand from the
session's recorded queries and cache (see :meth:`Session.weights`).
"""

from __future__ import annotations

import numpy as np
import torch

from kvviz.edit.draft import EditDraft
from kvviz.errors import KvvizError
from kvviz.edit.edit import Edit
from kvviz.session import Session
from kvviz.spelling import spell
from kvviz.transcript import SEGMENTS

SEGMENT_CODE = {name: i for i, name in enumerate(SEGMENTS)}


def attention_row(session: Session, at: int, layer: int, head: int | None) -> torch.Tensor:
    """What slot ``at`` attended to in ``layer``: ``(at + 1,)`` for one query head, or the mean over heads (None)."""
    def compute() -> torch.Tensor:
        if head is None:
            return session.weights(layer, at, at + 1)[:, 0].mean(0)
        return session.weights(layer, at, at + 1, head=head)[0, 0]

    return session.memoized("views", ("row", at, layer, head), compute)


def sink_share(session: Session, at: int, layer: int, head: int | None) -> dict | None:
    """A learned sink's share of slot ``at``'s attention in ``layer`` (one query head, or the mean over heads with
    None) as the strip draws it: ``{"share", "layer", "head"}`` (``1 − Σ α`` of :func:`attention_row`, float64); None
    for a model without sinks."""
    if not session.lm.attention.sinks:
        return None
    share = float(1 - attention_row(session, at, layer, head).double().sum())
    return {"share": share, "layer": layer, "head": "the mean of heads" if head is None else f"head {head}"}


def reply_as_cached(session: Session) -> tuple[str, str | None]:
    """The newest turn's reply as the cache holds it — its generated slots, decoded — and the text of the pending
    token (chosen, not yet cached; None once the turn has ended)."""
    cached = [i for i in session.produced[:-1] if i not in session.lm.stop_ids]
    text = session.lm.tokenizer.decode(cached, skip_special_tokens=True)
    return text, None if session.turn_ended else session.piece(session.pending)


def read_count(session: Session, at: int, layer: int) -> tuple[int, int] | None:
    """With sparse selection (DSA): how many slots the step of slot ``at`` read in ``layer``, and of how many it saw
    (not evicted); None for a model whose steps read every slot they see."""
    read = session.read_set(layer, at)
    if read is None:
        return None
    seen = at + 1 - int(session.commits.hidden(at, at + 1)[layer].all(0).sum())
    return int(read.sum()), seen


def index_reasons(scores: list[float], unread: list[bool]) -> dict[int, str]:
    """Why a step with sparse selection (DSA) read each slot or not, from its indexer's ``scores`` per slot and the
    ``unread`` ones (a what-if's :class:`~kvviz.whatif.step.Detail`): per slot, a line with its score and rank among
    the slots the step saw; empty without scores."""
    if not scores:
        return {}
    ranked = sorted(range(len(scores)), key=lambda slot: -scores[slot])
    rank = {slot: place + 1 for place, slot in enumerate(ranked)}
    read = [slot for slot, gone in enumerate(unread) if not gone]
    lowest = min(scores[slot] for slot in read)
    return {slot: f"indexer score {scores[slot]:.4g}, rank {rank[slot]} of {len(scores)}: "
            + (f"not read (the step read the {len(read)} of highest score, down to {lowest:.4g})" if unread[slot]
               else "read") for slot in range(len(scores))}


def window_start(session: Session, at: int, layer: int) -> int:
    """The first slot ``layer`` still sees at the step of slot ``at``: 0, or in a sliding window ``w`` the slot
    ``at − w + 1`` (the slots before it the window itself dropped, whatever the person edits)."""
    window = session.lm.attention.window(layer)
    return 0 if window is None else max(0, at - window + 1)


def _eviction_codes(edit) -> dict[int, int]:
    """Slot → 1 (evicted everywhere) or 2 (in some layers / KV heads only) for an edit's evictions."""
    codes: dict[int, int] = {}
    for eviction in edit.evictions:
        for slot in eviction.slots:
            codes[slot] = 1 if eviction.everywhere or codes.get(slot) == 1 else 2
    for merge in edit.merges:  # merged away in one layer and KV head
        codes.setdefault(merge.source, 2)
    return codes


SHADINGS = ("linear", "log", "rank")


def shade(row: torch.Tensor, shading: str = "linear") -> list[float]:
    """Attention ``(n,)`` as chip shades in [0, 1]: ``linear`` relative to the strongest slot (a sink leaves the rest
    white), ``log`` over the six decades below the strongest, or ``rank`` (the weakest 0, the strongest 1)."""
    row = row.double().cpu()
    top = row.max().clamp_min(1e-12)
    if shading == "log":
        return ((torch.log10((row / top).clamp_min(1e-6)) + 6) / 6).tolist()
    if shading == "rank":
        ranks = torch.empty_like(row).scatter_(0, row.argsort(stable=True), torch.arange(len(row), dtype=row.dtype))
        return (ranks / max(len(row) - 1, 1)).tolist()
    return (row / top).tolist()


def strip_chips(session: Session, draft: EditDraft, at: int, layer: int, head: int | None,
                shading: str = "linear", reasons: dict[int, str] | None = None) -> list[list]:
    """One row per slot up to ``at``: ``[slot, text (spelled: :func:`kvviz.spelling.spell`), segment code, turn, attention shade ∈ [0, 1] (see :func:`shade`),
    evicted 0/1/2 (no / everywhere / some layers or heads), key bits, value bits, selected 0/1, a control token the user
    typed 0/1, outside ``layer``'s sliding window at this step 0/1, committed eviction 0/1/2, committed key bits,
    committed value bits, (layer, KV head) pairs that evict the slot in the draft, the same committed, cached late
    0/1 (the end-of-turn token that closed the previous reply, first cached by this turn's prefill), why the policy
    that seeded the draft evicted it (``reasons``' line, or ""), not read by this step in ``layer`` 0/1 (sparse
    selection: its indexer did not pick it)]`` — the draft's
    columns are the edit being tried, the committed ones the cache as it stood after this step (the commits made up
    to then: part of the conversation, in force for the next step)."""
    if at < 0:
        return []
    row = attention_row(session, at, layer, head)
    start = window_start(session, at, layer)
    committed = session.commits.edit_at(at + 1).resolved(at + 1)
    gone = _eviction_codes(committed)
    relative = shade(row, shading)
    partial = {s for e in draft.policy.evictions if not e.everywhere for s in e.slots} | {m.source for m in draft.merges}
    lm, n = session.lm, len(session)
    scoped = Edit(evictions=draft.policy.evictions, merges=draft.merges)  # per (layer, KV head): a policy's, merges
    pairs = [(edit.evicted_mask(n, lm.layers, lm.kv_heads).sum((0, 1)).tolist() if 2 in codes else None)
             for edit, codes in ((scoped, {2} if partial else set()), (committed, set(gone.values())))]
    everywhere = draft.evicted | {s for e in draft.policy.evictions if e.everywhere for s in e.slots}
    segments, typed = session.transcript.segments(), session.transcript.typed_control
    slots, stops = session.transcript.slots, session.lm.stop_ids
    late = {s.slot for s in slots[1 : at + 1] if s.kind == "prefill" and s.id in stops
            and slots[s.slot - 1].turn < s.turn}
    read = session.read_set(layer, at)
    unread = [] if read is None else (~read).tolist()
    chips = []
    for slot in slots[: at + 1]:
        evicted = 1 if slot.slot in everywhere else 2 if slot.slot in partial else 0
        chips.append([slot.slot, spell(slot.text), SEGMENT_CODE[segments[slot.slot]], slot.turn, round(relative[slot.slot], 4),
                      evicted, draft.key_bits.get(slot.slot, 16), draft.value_bits.get(slot.slot, 16),
                      int(slot.slot in draft.selected), int(slot.slot in typed), int(slot.slot < start),
                      gone.get(slot.slot, 0), committed.key_bits.get(slot.slot, 16),
                      committed.value_bits.get(slot.slot, 16),
                      *(int(counts[slot.slot]) if counts else 0 for counts in pairs), int(slot.slot in late),
                      (reasons or {}).get(slot.slot, ""), int(bool(unread) and unread[slot.slot])])
    return chips


def strip_reasons(session: Session, draft: EditDraft, layer: int, head: int | None) -> dict[int, str]:
    """Why the policy that seeded ``draft`` evicts each slot it evicts there: per slot, its fate in ``layer`` and the
    KV head of query head ``head`` (every KV head of the layer for the mean of heads), at the step and budget it
    decided for; empty when no policy seeded the draft or its step is no longer cached."""
    if draft.decided_by is None:
        return {}
    policy, budget, at = draft.decided_by
    if not 0 <= at < len(session):
        return {}
    try:  # the Policies tab's "why" shares this memo
        decision = session.memoized("why", (repr(policy), repr(budget), at),
                                    lambda: policy.decision(session, budget, at), keep=1)
    except KvvizError:
        return {}
    lm = session.lm
    kv_heads = range(lm.kv_heads) if head is None else [head // (lm.heads // lm.kv_heads)]
    slots = {s for e in draft.policy.evictions for s in e.slots}
    lines = [decision.reasons(layer, kv, slots) for kv in kv_heads]
    return {slot: f"{draft.policy_name} at slot {at}, budget {budget}:\n" + "\n".join(
        own[slot] for own in lines if slot in own) for slot in sorted(slots)}


def find_slots(session: Session, at: int, query: str) -> list[int]:
    """The slots up to ``at`` whose text overlaps a match of ``query`` (case ignored) in the text of all of them, so
    a word split over several tokens is found too."""
    spans = session.transcript.matches(query.strip(), at + 1, ignore_case=True)
    return sorted({slot for span in spans for slot in span})


def kept_per_head(session: Session, edit, at: int) -> tuple[int, int]:
    """The fewest and the most of the ``at`` slots before the step that ``edit`` keeps in one (layer, KV head)."""
    lm = session.lm
    kept = at - edit.evicted_mask(at, lm.layers, lm.kv_heads).sum(-1)  # (L, KV)
    return int(kept.min()), int(kept.max())


FORMAT_WORDS = {"int": "int", "e4m3": "FP8 E4M3", "e5m2": "FP8 E5M2", "e4m3-ue8m0": "FP8 E4M3 (power-of-two scales)",
                "nvfp4": "NVFP4", "nvfp4-4over6": "NVFP4 4/6", "mxfp4": "MXFP4"}


def quantized_words(bits: dict[int, int], quantizer, noun: str) -> str:
    """``bits`` (slot → width) of one tensor kind (``noun``: "keys" or "values") in words, with the format and axis of
    its ``quantizer``: ``"3 keys to int4 per channel"``, ``"2 values to int4 and 1 to int2, per token"``, ``"1 key
    to NVFP4 per token"``, ``"2 keys back to 16 bits"``."""
    if not bits:
        return ""
    counts = {width: sum(1 for b in bits.values() if b == width) for width in sorted(set(bits.values()), reverse=True)}
    name = FORMAT_WORDS.get(quantizer.format, quantizer.format)
    fixed = quantizer.format != "int"  # a float format has its own width: named as it is
    parts = [("back to 16 bits" if width >= 16 else f"to {name}" if fixed else f"to {name}{width}") for width in counts]
    first, *rest = [f"{count} {part}" for count, part in zip(counts.values(), parts)]
    count = next(iter(counts.values()))
    words = f"{first.split(' ', 1)[0]} {noun if count != 1 else noun[:-1]} {first.split(' ', 1)[1]}"
    words += "".join(f" and {part}" for part in rest)
    rounded = any(width < 16 for width in counts)
    return words + (("," if rest else "") + f" per {quantizer.axis}" if rounded else "")


def commit_rows(session: Session) -> list[dict]:
    """The session's committed edits, oldest first: ``{"index", "at" (the step it applies from), "turn" (from 1),
    "evicted"
    (slots it newly evicted, everywhere or in some layers / heads), "keys", "values" (slots whose key / value bits it
    changed), "quantized" (those changes in words: bits, format and axis of each kind, :func:`quantized_words`)}``."""
    rows, before = [], None
    for index, commit in enumerate(session.commits.stack):
        edit = commit.edit.resolved(commit.at)
        old_gone = _eviction_codes(before) if before is not None else {}
        gone = _eviction_codes(edit)
        changed = lambda now, then: sorted(s for s, b in now.items() if then.get(s, 16) != b)  # noqa: E731
        rows.append({"index": index, "at": commit.at, "turn": session.transcript.slots[commit.at - 1].turn + 1,
                     "evicted": sorted(s for s, c in gone.items() if old_gone.get(s) != c),
                     "keys": changed(edit.key_bits, before.key_bits if before else {}),
                     "values": changed(edit.value_bits, before.value_bits if before else {})})
        words = [quantized_words({s: table[s] for s in rows[-1][kind]}, quantizer, kind)
                 for kind, table, quantizer in (("keys", edit.key_bits, edit.keys), ("values", edit.value_bits,
                                                                                   edit.values)) if rows[-1][kind]]
        rows[-1]["quantized"] = "quantized " + " and ".join(words) if words else ""
        before = edit
    return rows


def pool(values: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Max over ``ceil(n / size)``-wide blocks along ``axis`` (spikes such as attention sinks stay visible)."""
    n = values.shape[axis]
    if n <= size:
        return values
    width = -(-n // size)
    pad = [(0, 0)] * values.ndim
    pad[axis] = (0, width * (-(-n // width)) - n)
    padded = np.pad(values, pad)
    shape = list(padded.shape)
    shape[axis : axis + 1] = [shape[axis] // width, width]
    return padded.reshape(shape).max(axis=axis + 1)


def overview(session: Session, at: int, bins: int = 48) -> np.ndarray:
    """Each layer's and query head's attention row of slot ``at``, max-pooled to ``bins``: ``(L, H, ≤ bins)``."""
    def compute() -> np.ndarray:
        rows = np.stack([session.weights(layer, at, at + 1)[:, 0].cpu().numpy() for layer in range(session.lm.layers)])
        return pool(rows, bins, axis=2)

    return session.memoized("views", ("overview", at, bins), compute)


def head_map(session: Session, layer: int, head: int, size: int = 320, stop: int | None = None
             ) -> tuple[np.ndarray, int]:
    """The causal map of one head (queries × keys, the cached slots before ``stop``: all by default; a step looked
    back at shows no later row), max-pooled to ``≤ size`` per side.

    Returns the map and the block width (slots per pixel)."""
    def compute() -> tuple[np.ndarray, int]:
        weights = session.weights(layer, 0, stop, head=head)[0].cpu().numpy()  # (n, n)
        pooled = pool(pool(weights, size, axis=0), size, axis=1)
        return pooled, -(-weights.shape[0] // pooled.shape[0])

    return session.memoized("views", ("map", layer, head, size, stop), compute)
