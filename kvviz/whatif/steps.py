"""Where an edit matters: the what-if of every step of the newest turn at once (docs/math.md §6 at each step).

The what-if re-runs one step, usually the newest — often the reply's last token, whose next token is the end of the
turn whatever the cache holds. The step that chose the answer can flip under the same edit. This re-runs the steps of
the newest turn that chose a token (the query's last slot, then every generated slot) with the full and with the
edited cache, and gives each step's KL and top-1 on both sides, so the page can point at the step that mattered.

Each step sees what it saw then: the slots before it as the model computed them, hidden per (layer, KV head) as the
committed edit hid them at that step (the full side) and with the edit on top (the edited side) — the what-if's
definition, step by step. An edit that only evicts is done in batched passes of the session's own cache (one row per
step, each with its own mask: :func:`~kvviz.step_variants.rerun_rows`), the full side once per cache version and the
edited side only for the steps it hides something from; one that rewrites K/V (quantized, pruned, merged), or a step
with such a committed edit in force, is re-run step by step by :func:`what_if`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.session import Session
from kvviz.step_variants import rerun_rows
from kvviz.whatif.metrics import Reference, ranks_of
from kvviz.whatif.step import what_if

ROWS = 64  # rows per batched pass: activations of ~64 tokens, whatever the turn's length
KEPT = "step_effects_of"  # the session memo's kind for the newest turn's effects of the last edit asked about


@dataclass(frozen=True)
class StepEffect:
    """One step: slot ``slot``'s decode step (it chose the token ``chose``: the next slot's, or the pending one).

    ``fact``: of the tokens the edit evicts before this step (their words, if any has a letter or digit), the one
    the full cache's step found most likely, with its rank (0 = the top-1) on both sides — " Rex" falling from
    rank 1 to 45 while the top-1 stays is how a step that never says the fact still reads it. None for a step the
    edit evicts nothing from, or one re-run with K/V rewritten (ranked over its top-k only, not the vocabulary)."""

    slot: int
    chose: int
    kl: float  # KL(p_full ‖ p_edited) of the step's next-token distribution, nats
    top1_full: int
    top1_edited: int
    fact: int | None = None
    fact_rank_full: int | None = None
    fact_rank_edited: int | None = None

    @property
    def flips(self) -> bool:
        return self.top1_full != self.top1_edited


@dataclass(frozen=True)
class StepEffects:
    """The edit's effect at each step of the newest turn that chose a token, in slot order."""

    steps: list[StepEffect]

    @property
    def worst(self) -> StepEffect | None:
        """The step with the largest KL (the earliest among equals), None without steps or when no step changed."""
        if not self.steps:
            return None
        worst = max(self.steps, key=lambda step: (step.kl, -step.slot))
        return worst if worst.kl > 0 or worst.flips else None

    def to_dict(self) -> dict:
        return {"steps": [asdict(step) for step in self.steps]}


def turn_steps(session: Session) -> list[int]:
    """The slots whose steps chose the newest turn's tokens: its query's last slot and each generated slot (the
    newest one chose the pending token). Empty before a reply starts."""
    transcript = session.transcript
    turn = [slot for slot in transcript.slots if slot.turn == transcript.turn]
    query = [slot.slot for slot in turn if slot.kind == "prefill"]
    generated = [slot.slot for slot in turn if slot.kind == "decode"]
    if not query or (not generated and session.pending is None):
        return []
    return [query[-1], *generated]


def step_effects(session: Session, edit: Edit, steps: list[int] | None = None) -> StepEffects:
    """The effect of ``edit`` (as the draft gives it for the newest step) at each step of ``steps`` (default:
    :func:`turn_steps`, and the result is kept for the cache's version: :func:`kept_effects`); see the module doc.
    The session is not changed. Raises :class:`KvvizError` for an edit that does not fit a step (as :func:`what_if`
    would)."""
    if steps is None:
        return session.memoized(KEPT, edit.key, lambda: _effects(session, edit, turn_steps(session)), keep=1)
    return _effects(session, edit, list(steps))


def _is_word(text: str) -> bool:
    """A token's text with a letter or a digit: what a fact is made of (not its spaces or punctuation)."""
    return any(c.isalnum() for c in text)


def unsaid_words(session: Session, edit: Edit) -> list[str]:
    """The words ``edit`` evicts from before the newest reply (their tokens with a letter or digit, stripped, in slot
    order) when the reply says none of them (case-insensitively), else ``[]``: a reply that never said the fact
    evicted may still have read it, but its newest step rarely shows it. ``[]`` too before a reply."""
    start = next((s.slot for s in session.transcript.slots if s.turn == session.transcript.turn and s.kind == "decode"),
                 None)
    if start is None:
        return []
    pieces = [session.piece(session.transcript.slots[s].id).strip() for s in sorted(edit.evicted_slots()) if s < start]
    words = list(dict.fromkeys(filter(_is_word, pieces)))
    reply = session.reply.casefold()
    return [] if any(word.casefold() in reply for word in words) else words


def kept_effects(session: Session, edit: Edit) -> StepEffects | None:
    """:func:`step_effects` of ``edit`` over the newest turn if it was computed for the cache as it is, else None
    (nothing is run: a pass over a long reply costs about a forward of that many tokens)."""
    return session.memo.peek(session.version, KEPT, edit.key)


def _effects(session: Session, edit: Edit, steps: list[int]) -> StepEffects:
    if any(not 0 <= slot < len(session) for slot in steps):
        raise KvvizError(f"the steps must be cached slots (0..{len(session) - 1})")
    pairs = {slot: session.commits.step_edits(slot, edit) for slot in steps}
    rewrites = [slot for slot, (full, edited) in pairs.items() if full.rewrites or edited.rewrites]
    effects = {slot: _one(session, edit, slot) for slot in rewrites}
    effects |= _batched(session, [slot for slot in steps if slot not in effects], pairs)
    return StepEffects([effects[slot] for slot in steps])


def _chose(session: Session, slot: int) -> int:
    after = slot + 1
    return session.transcript.slots[after].id if after < len(session) else session.pending


def _one(session: Session, edit: Edit, slot: int) -> StepEffect:
    """A step whose cache an edit rewrites: the what-if itself."""
    nt = what_if(session, edit, at=slot, topk=1).next_token
    return StepEffect(slot, _chose(session, slot), nt.kl, nt.full[0].id, nt.edited[0].id)


def _batched(session: Session, slots: list[int], pairs: dict) -> dict[int, StepEffect]:
    """Steps whose caches differ only in what they hide: the full side of every step (kept for the cache's version,
    so the next edit re-runs only its own side), and the edited side of the steps where the edit hides something
    more; ``ROWS`` rows per pass."""
    lm = session.lm
    shape = (lm.layers, lm.kv_heads, lm.device)
    n = max(slots, default=0)

    def visible(slot: int, hidden: torch.Tensor) -> torch.Tensor:  # (L, KV, n): the slots before ``slot`` not hidden
        seen = torch.zeros(lm.layers, lm.kv_heads, n, dtype=torch.bool, device=lm.device)
        seen[..., :slot] = ~hidden
        return seen

    def full() -> dict[int, torch.Tensor]:
        return _rows(session, [(slot, visible(slot, pairs[slot][0].evicted_mask(slot, *shape))) for slot in slots])

    fulls = session.memoized("step_effects", tuple(slots), full, keep=1)
    edited_rows = []
    for slot in slots:
        hidden, more = (edit.evicted_mask(slot, *shape) for edit in pairs[slot])
        if bool((more & ~hidden).any()):
            edited_rows.append((slot, visible(slot, more)))
    edited = _rows(session, edited_rows)
    effects = {}
    for slot in slots:
        logits = edited.get(slot)
        kl = 0.0 if logits is None else float(Reference(fulls[slot]).kl(logits))
        top1 = int(fulls[slot].argmax())
        top1_edited = top1 if logits is None else int(logits.argmax())
        fact = () if logits is None else _fact(session, pairs[slot][1], slot, fulls[slot], logits)
        effects[slot] = StepEffect(slot, _chose(session, slot), kl, top1, top1_edited, *fact)
    return effects


def _fact(session: Session, edit: Edit, slot: int, full: torch.Tensor, edited: torch.Tensor) -> tuple:
    """``(id, rank full, rank edited)`` of the evicted token the full step ``full`` ``(V,)`` ranks highest (see
    :class:`StepEffect`), ``()`` when the step sees no evicted slot."""
    slots = session.transcript.slots
    ids = sorted({slots[s].id for s in edit.evicted_slots() if s < slot})
    if not ids:
        return ()
    ids = torch.tensor([id_ for id_ in ids if _is_word(session.piece(id_))] or ids)
    full_ranks, edited_ranks = ranks_of(torch.stack([full, edited]), ids).tolist()
    best = min(range(len(ids)), key=lambda i: (full_ranks[i], int(ids[i])))
    return int(ids[best]), full_ranks[best], edited_ranks[best]


def _rows(session: Session, rows: list[tuple[int, torch.Tensor]]) -> dict[int, torch.Tensor]:
    """The logits ``(V,)`` float32 of each ``(slot, visible (L, KV, n))`` row's step, ``ROWS`` rows per pass."""
    logits = {}
    for start in range(0, len(rows), ROWS):
        chunk = rows[start:start + ROWS]
        out = rerun_rows(session, [slot for slot, _ in chunk], torch.stack([seen for _, seen in chunk])).cpu()
        logits |= {slot: row for (slot, _), row in zip(chunk, out)}
    return logits
