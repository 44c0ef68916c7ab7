"""Two (or more) policies at the same budget, side by side: their masks' overlap and what each does to the step."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.edits import Edit
from kvviz.policies import Policy
from kvviz.session import Session
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
    """Run each policy's Edit through :func:`~kvviz.whatif.what_if` at slot ``at`` (default: the newest)."""
    lm = session.lm
    at = len(session) - 1 if at is None else at
    rows, masks, edits = [], {}, {}
    for policy in policies:
        edit = policy.edit(session, budget, at)
        result = what_if(session, edit, at=at, topk=5)
        masks[policy.name], edits[policy.name] = edit.evicted_mask(at, lm.layers, lm.kv_heads), edit
        rows.append(PolicyRow(policy.name, int((~masks[policy.name]).sum(-1).float().mean()), result.next_token.kl,
                              result.next_token.tv, result.next_token.top1_changed, float(result.heads["rho"].mean()),
                              result.memory.edited_bytes))
    overlap = None
    if len(policies) >= 2:
        first, second = masks[policies[0].name], masks[policies[1].name]
        union = (first | second).sum()
        overlap = float((first & second).sum() / union) if union else 1.0
    return PolicyComparison(rows, overlap, edits)
