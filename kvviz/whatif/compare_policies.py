"""Two (or more) policies at the same budget, side by side: their masks' overlap and what each does to the step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz import attention_math as am
from kvviz.edit.check import check_edit
from kvviz.edit.edit import Edit
from kvviz.policies import Policy
from kvviz.session import Session
from kvviz.step_variants import rerun
from kvviz.whatif.full_step import kept_full_step
from kvviz.whatif.memory import cache_memory
from kvviz.whatif.metrics import compare
from kvviz.whatif.step import what_if


@dataclass(frozen=True)
class PolicyRow:
    """What one policy's mask does to the step: slots kept (mean over layers and KV heads), KL, total variation,
    whether the top-1 token flips, the mean evicted mass ρ over layers and query heads, and the packed bytes."""

    policy: str
    kept: int
    kl: float
    tv: float
    top1_changed: bool
    mean_rho: float
    edited_bytes: int


@dataclass(frozen=True)
class PolicyComparison:
    """One row per policy; ``overlap``: the Jaccard index of the evicted (layer, KV head, slot) entries of the first
    two policies (None with one policy); ``edits``: each policy's Edit by name."""

    rows: list[PolicyRow]
    overlap: float | None
    edits: dict[str, Edit]


def compare_policies(session: Session, policies: list[Policy], budget: int | float,
                     at: int | None = None) -> PolicyComparison:
    """What each policy's Edit does to the step of slot ``at`` (default: the newest), as :func:`~kvviz.whatif.what_if`
    measures it: when the policies only evict and the session's committed edit rewrites no K/V, every policy's
    edited run is one variant of a single batched pass (kvviz.step_variants; the same numbers as a what-if each, up
    to the rounding of another batch shape), otherwise a what-if each."""
    lm = session.lm
    at = len(session) - 1 if at is None else at
    edits = {policy.name: policy.edit(session, budget, at) for policy in policies}
    for edit in edits.values():
        check_edit(lm, session.transcript, edit, at)
    measured = _batched(session, edits, at)
    rows, masks = [], {}
    for name, edit in edits.items():
        masks[name] = edit.evicted_mask(at, lm.layers, lm.kv_heads)
        row = measured[name] if measured is not None else _alone(session, edit, at)
        rows.append(PolicyRow(name, int((~masks[name]).sum(-1).float().mean()), *row))
    overlap = None
    if len(policies) >= 2:
        first, second = masks[policies[0].name], masks[policies[1].name]
        union = (first | second).sum()
        overlap = float((first & second).sum() / union) if union else 1.0
    return PolicyComparison(rows, overlap, edits)


def _alone(session: Session, edit: Edit, at: int) -> tuple:
    """(KL, TV, top-1 changed, mean ρ, edited bytes) of ``edit``'s what-if."""
    result = what_if(session, edit, at=at, topk=5)
    return (result.next_token.kl, result.next_token.tv, result.next_token.top1_changed,
            float(result.heads["rho"].mean()), result.memory.edited_bytes)


def _batched(session: Session, edits: dict[str, Edit], at: int) -> dict[str, tuple] | None:
    """:func:`_alone` of every edit from one batched pass of the step (None where that pass does not apply)."""
    lm = session.lm
    steps = [session.commits.step_edits(at, edit) for edit in edits.values()]
    full = steps[0][0]
    if full.rewrites or any(edited.rewrites for _, edited in steps) or at < 1:
        return None
    shape = (at + 1, lm.layers, lm.kv_heads, lm.device)
    hidden_full = full.evicted_mask(*shape)
    hidden = torch.stack([edited.evicted_mask(*shape) for _, edited in steps])  # (B, L, KV, at + 1)
    logits = rerun(session, at, ~hidden[..., :at])
    full_step = kept_full_step(session, at, full, hidden_full)  # the what-if's own, kept between clicks
    alpha = full_step.probe.alpha  # (L, H, at + 1)
    measured = {}
    for name, (_, edited), mask, row in zip(edits, steps, hidden, logits):
        next_token = compare(full_step.reference, row, 5, session.piece)
        rho = am.evicted_mass(alpha, am.expand_kv(mask & ~hidden_full, lm.heads, dim=1))
        memory = cache_memory(edited, mask[:, :, :at].cpu(), full_step.segments, lm.geometry.cached_widths, lm.dtype,
                              lm.attention.outside(at, at))
        measured[name] = (next_token.kl, next_token.tv, next_token.top1_changed, float(rho.mean()),
                          memory.edited_bytes)
    return measured
