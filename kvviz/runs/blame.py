"""Blame: at one step of a policy run, which evicted slots mattered (docs/math.md §9).

Each candidate — an evicted slot, or a word of evicted slots — is put back alone into the policy's cache of that step,
and the step is re-run; the report says how much KL to the full run's next-token distribution is left after each
restore and whether the full run's token comes back on top. All variants of the step run in one batched forward pass:
the step's token is fed once per variant, at its true position, on the step's cache (shared, not copied), and a probe
gives every variant its own mask — its restored slots visible, and of the new slots only its own.

Restoring nothing gives the run's own KL at that step. Restoring everything gives KL 0 at the first step after a
compression of the prompt; later, the slots the run wrote itself hold K/V computed on the compressed cache, and the
KL left with everything restored (``kl_all_restored``) is what eviction at this step cannot explain. Quantization, if
the run had any, stays as the run had it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz import kv_cache
from kvviz.errors import KvvizError
from kvviz.recorder import Probe, probing
from kvviz.runs.policy_run import PolicyRun, TurnRun, kl_divergence
from kvviz.whatif.full_step import layer_views, prefix_kv, stacked


@dataclass(frozen=True)
class BlameRow:
    slots: list[int]
    kl_after_restore: float
    top1_restored: bool
    mass: float  # attention the full cache's step paid these slots (sum over layers and query heads)


@dataclass(frozen=True)
class Blame:
    turn: int
    step: int
    slot: int
    kl: float  # the policy's KL at this step, nothing restored
    kl_all_restored: float  # every evicted slot back (see the module doc)
    top1_full: int
    top1_policy: int
    rows: list[BlameRow]  # best restore first


class _Variants(Probe):
    """Gives variant ``i`` the mask ``visible[i]`` over the step's cache and its own new slot; keeps the attention
    weights of variant 0 (everything restored), summed over query heads and layers by the caller."""

    def __init__(self, visible: torch.Tensor, scaling: float):
        self.visible, self.scaling = visible, scaling  # (B, L, KV, at)
        self.mass: list[torch.Tensor] = []

    def on_query(self, layer, query, key, value):
        batch, _, _, at = self.visible.shape
        own = torch.eye(batch, dtype=torch.bool, device=key.device)[None].expand(key.shape[1], -1, -1)
        mask = torch.cat([self.visible[:, layer].to(key.device).transpose(0, 1), own], dim=-1)  # (KV, B, at + B)
        scores = (query[0, :, :1].float() @ key[0, :, : at + 1].float().repeat_interleave(
            query.shape[1] // key.shape[1], 0).transpose(-1, -2)) * self.scaling  # (H, 1, at + 1): variant 0
        self.mass.append(torch.softmax(scores, -1)[:, 0, :at].sum(0).cpu())
        return mask[None]


def _slot_of(run: TurnRun, step: int) -> int:
    if not 0 <= step < len(run.steps):
        raise KvvizError(f"step {step} is not a decode step of this turn (0..{len(run.steps) - 1})")
    return run.prompt_end + step


def variants(run: TurnRun, step: int, restores: list[set[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Re-run decode step ``step`` once with every slot restored and once per set in ``restores``.
    Returns the logits ``(1 + len(restores), V)``, the evicted mask of the step ``(L, KV, at)`` and the attention
    mass variant 0 (everything restored) paid each slot ``(at,)``."""
    session = run.forced.session
    at = _slot_of(run, step)
    hidden = session.commits.hidden(at, at).cpu()  # (L, KV, at)
    visible = (~hidden)[None].repeat(1 + len(restores), 1, 1, 1)
    visible[0] = True
    for row, slots in enumerate(restores, start=1):
        visible[row, :, :, sorted(slots)] = True
    lm, slot = session.lm, session.transcript.slots[at]
    buffers = stacked(prefix_kv(session, at, session.commits.edit_at(at)), room=len(visible))
    probe = _Variants(visible, lm.scaling)
    with torch.no_grad(), probing(probe):
        out = lm.model(input_ids=torch.full((1, len(visible)), slot.id, device=lm.device),
                       position_ids=torch.full((1, len(visible)), slot.position, device=lm.device),
                       cache=kv_cache.over(layer_views(buffers), at), use_cache=True, logits_to_keep=len(visible))
    return out.logits[0].float(), hidden, torch.stack(probe.mass).sum(0)


def units(run: TurnRun, hidden: torch.Tensor, unit: str) -> list[list[int]]:
    """The evicted slots of a step (hidden anywhere in ``hidden`` ``(L, KV, at)``) as candidates: one per slot, or
    per word (a word starts at a piece that begins with a space or a line break)."""
    slots = hidden.any(0).any(0).nonzero()[:, 0].tolist()
    if unit == "slot":
        return [[s] for s in slots]
    if unit != "word":
        raise KvvizError(f"unit must be 'slot' or 'word', got {unit!r}")
    pieces = run.forced.session.transcript.slots
    words: list[list[int]] = []
    for s in slots:
        text = pieces[s].text
        if words and words[-1][-1] == s - 1 and not text[:1].isspace():
            words[-1].append(s)
        else:
            words.append([s])
    return words


def blame(result: PolicyRun, turn: int = -1, step: int | None = None, unit: str = "slot", limit: int = 32) -> Blame:
    """Rank the evicted candidates of ``step`` (default: the divergence, else the step of largest KL) by the KL left
    after restoring each alone; the ``limit`` candidates the full cache's step attends to most are re-run."""
    run = result.turns[turn]
    if not run.steps:
        raise KvvizError("this turn has no decode step to blame")
    if step is None:
        step = run.divergence if run.divergence is not None and run.divergence >= 0 else \
            max(range(len(run.steps)), key=lambda s: run.steps[s].kl)
    logits, hidden, mass = variants(run, step, [set()])
    candidates = units(run, hidden, unit)
    candidates.sort(key=lambda slots: -float(mass[slots].sum()))
    candidates = candidates[:limit]
    restored = variants(run, step, [set(c) for c in candidates])[0][1:]
    rows = [_row(run, step, c, restored[i], mass) for i, c in enumerate(candidates)]
    rows.sort(key=lambda r: (r.kl_after_restore, -r.mass))
    target = run.full_logits[step + 1]
    return Blame(turn if turn >= 0 else len(result.turns) + turn, step, _slot_of(run, step),
                 kl_divergence(target, logits[1]), kl_divergence(target, logits[0]), run.full_ids[step + 1],
                 int(logits[1].argmax()), rows)


def _row(run: TurnRun, step: int, slots: list[int], logits: torch.Tensor, mass: torch.Tensor) -> BlameRow:
    """One restore measured against the full run's next-token distribution at ``step``."""
    return BlameRow(sorted(slots), kl_divergence(run.full_logits[step + 1], logits),
                    int(logits.argmax()) == run.full_ids[step + 1], float(mass[sorted(slots)].sum()))


def restore(result: PolicyRun, slots: list[int], turn: int = -1, step: int = 0) -> BlameRow:
    """The step re-run with ``slots`` restored together (e.g. the top 3 of a blame)."""
    run = result.turns[turn]
    logits, _, mass = variants(run, step, [set(slots)])
    return _row(run, step, slots, logits[1], mass)
