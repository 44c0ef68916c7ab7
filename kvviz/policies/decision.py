"""Why a slot went: a policy's decision kept with its numbers — every candidate's score as it was ranked, the budget
of each layer and KV head, and the threshold the evicted ones fell under (the lowest score still kept there).

A slot is evicted in a (layer, KV head) when its rank in the order of keeping (:func:`kvviz.policies.base.keep_rank`)
is at or past the budget: its score is under the threshold, or equal to it and later than the slot kept with it
(ties keep the earlier slot; among protected slots, scored ``+inf``, the later one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

INF = float("inf")


@dataclass(frozen=True)
class SlotWhy:
    """One (layer, KV head) of a slot's fate at one decision. ``rank`` counts from 1 in the order of keeping (None
    for a slot that was not a candidate); ``margin`` is ``score − threshold`` (negative: under it)."""

    layer: int
    kv_head: int
    outcome: str  # "evicted", "kept", "protected" or "not a candidate"
    score: float
    threshold: float
    rank: int | None
    budget: int
    candidates: int  # slots the decision chose among in this layer and KV head
    reason: str

    @property
    def margin(self) -> float:
        return self.score - self.threshold


@dataclass(frozen=True)
class Decision:
    """A policy's decision over the slots ``0..at-1``: ``scores`` ``(L, KV, at)`` float32 as ranked (``-inf`` where
    not a candidate), ``budgets`` ``(L, KV)`` slots kept, ``alive`` the candidates and ``evicted`` the slots it
    evicts, both bool ``(L, KV, at)``; ``rank`` ``(L, KV, at)`` each slot's place in the order of keeping, 0 first."""

    at: int
    scores: torch.Tensor
    budgets: torch.Tensor
    alive: torch.Tensor
    evicted: torch.Tensor
    rank: torch.Tensor

    @property
    def threshold(self) -> torch.Tensor:
        """``(L, KV)`` float32: the lowest score kept in each layer and KV head (``+inf`` where only protected slots
        are kept)."""
        kept = self.alive & ~self.evicted
        return torch.where(kept, self.scores, INF).amin(-1)

    def why(self, slot: int) -> list[SlotWhy]:
        """``slot``'s fate in every layer and KV head, layer by layer."""
        threshold, counts = self.threshold, self.alive.sum(-1)
        rows = []
        for layer in range(self.scores.shape[0]):
            for head in range(self.scores.shape[1]):
                rows.append(explain(float(self.scores[layer, head, slot]), float(threshold[layer, head]),
                                    int(self.rank[layer, head, slot]) + 1, int(self.budgets[layer, head]),
                                    int(counts[layer, head]), bool(self.alive[layer, head, slot]),
                                    bool(self.evicted[layer, head, slot]), layer, head))
        return rows


    def reasons(self, layer: int, kv_head: int, slots: Iterable[int]) -> dict[int, str]:
        """One line per slot of ``slots`` (candidates of this decision) for one layer and KV head: its outcome, score
        against the lowest kept score, rank and budget (what the strip's tooltips say)."""
        threshold, count = float(self.threshold[layer, kv_head]), int(self.alive[layer, kv_head].sum())
        budget = int(self.budgets[layer, kv_head])
        lines = {}
        for slot in slots:
            if 0 <= slot < self.at:
                why = explain(float(self.scores[layer, kv_head, slot]), threshold,
                              int(self.rank[layer, kv_head, slot]) + 1, budget, count,
                              bool(self.alive[layer, kv_head, slot]), bool(self.evicted[layer, kv_head, slot]),
                              layer, kv_head)
                score = "protected" if why.score == INF else f"score {why.score:.4g} vs lowest kept {why.threshold:.4g}"
                lines[slot] = f"layer {layer}, KV head {kv_head}: {why.outcome} ({score}); {why.reason}"
        return lines


def explain(score: float, threshold: float, rank: int, budget: int, candidates: int, alive: bool, evicted: bool,
            layer: int, head: int) -> SlotWhy:
    """One :class:`SlotWhy`, its reason in words."""
    if not alive:
        return SlotWhy(layer, head, "not a candidate", score, threshold, None, budget, candidates,
                       "not a candidate: evicted before, or outside the layer's sliding window")
    if score == INF:
        outcome = "evicted" if evicted else "protected"
        reason = ("protected (a recent or sink slot), but the budget is smaller than the protected slots and keeps "
                  "the most recent of them" if evicted else "protected: a recent or sink slot the policy always keeps")
        return SlotWhy(layer, head, outcome, score, threshold, rank, budget, candidates, reason)
    if not evicted:
        return SlotWhy(layer, head, "kept", score, threshold, rank, budget, candidates,
                       f"kept: rank {rank} of {candidates}, within the budget of {budget}")
    reason = (f"tied with the lowest kept score at rank {rank} of {candidates}; ties keep the earlier slot"
              if score == threshold else f"scored under the lowest kept score: rank {rank} of {candidates}, "
              f"past the budget of {budget}")
    return SlotWhy(layer, head, "evicted", score, threshold, rank, budget, candidates, reason)
