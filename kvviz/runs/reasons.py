"""Why each slot left a compressed run: kept from every decision the policy made (see
:class:`~kvviz.policies.decision.Decision`), compactly — an eviction is final, so each (layer, KV head, slot) is
evicted at most once and its score, rank and candidate count at that decision fit one entry; the thresholds and
budgets are kept per decision, ``(L, KV)`` each. A run of ``S`` decisions over ``n`` slots holds
``L·KV·(12·n + 12·S)`` bytes instead of every decision's ``L·KV·at`` scores.
"""

from __future__ import annotations

import torch

from kvviz.policies.decision import Decision, SlotWhy, explain


class Reasons:
    """Per (layer, KV head, slot): the slot ``at`` of the decision that evicted it (``-1``: never), its score, its
    rank (0 first) and the number of candidates then; per decision ``at``: thresholds and budgets ``(L, KV)``."""

    def __init__(self, layers: int, kv_heads: int):
        self.when = torch.full((layers, kv_heads, 0), -1, dtype=torch.int32)
        self.score = torch.zeros(layers, kv_heads, 0)
        self.rank = torch.zeros(layers, kv_heads, 0, dtype=torch.int32)
        self.count = torch.zeros(layers, kv_heads, 0, dtype=torch.int32)
        self.thresholds: dict[int, torch.Tensor] = {}
        self.budgets: dict[int, torch.Tensor] = {}

    def record(self, decision: Decision) -> None:
        """Keep what explains ``decision``'s evictions."""
        at, hit = decision.at, decision.evicted
        grow = at - self.when.shape[-1]
        if grow > 0:
            pad = torch.nn.functional.pad
            self.when, self.score = pad(self.when, (0, grow), value=-1), pad(self.score, (0, grow))
            self.rank, self.count = pad(self.rank, (0, grow)), pad(self.count, (0, grow))
        counts = decision.alive.sum(-1, keepdim=True).int().expand_as(hit)
        self.when[..., :at][hit] = at
        self.score[..., :at][hit] = decision.scores[hit]
        self.rank[..., :at][hit] = decision.rank[hit].int()
        self.count[..., :at][hit] = counts[hit]
        self.thresholds[at], self.budgets[at] = decision.threshold, decision.budgets.clone()

    def evicting(self, start: int = 0, stop: int | None = None) -> list[int]:
        """The decisions at ``start <= at < stop`` that evicted at least one slot somewhere (one pass over
        :attr:`when`, whatever the number of decisions)."""
        stop = torch.iinfo(torch.int32).max if stop is None else stop
        evicted = set(torch.unique(self.when).tolist())
        return [at for at in self.thresholds if start <= at < stop and at in evicted]

    def only_protected(self, decisions: list[int]) -> list[int]:
        """Those of ``decisions`` (see :meth:`evicting`) that kept only protected slots (scored ``+inf``: the
        policy's recent or sink slots) in every layer and KV head: the budget was spent before the policy's own scores
        chose anything, so it kept recency (or sinks) alone."""
        return [at for at in decisions if bool(torch.isinf(self.thresholds[at]).all())]

    def of_head(self, layer: int, head: int, start: int = 0, stop: int | None = None) -> dict[int, tuple[int, SlotWhy]]:
        """The slots ``layer`` / ``head`` lost by decisions at ``start <= at < stop``: slot → ``(at, why)``."""
        when = self.when[layer, head]
        hit = (when >= start) & (when < (stop if stop is not None else torch.iinfo(torch.int32).max))
        return {slot: self._why(slot, layer, head) for slot in hit.nonzero()[:, 0].tolist()}

    def _why(self, slot: int, layer: int, head: int) -> tuple[int, SlotWhy]:
        at = int(self.when[layer, head, slot])
        return at, explain(float(self.score[layer, head, slot]), float(self.thresholds[at][layer, head]),
                           int(self.rank[layer, head, slot]) + 1, int(self.budgets[at][layer, head]),
                           int(self.count[layer, head, slot]), True, True, layer, head)

    def why(self, slot: int, start: int = 0, stop: int | None = None) -> list[tuple[int, SlotWhy]]:
        """``slot``'s evictions by decisions at ``start <= at < stop``: ``(at, why)`` for each (layer, KV head) it
        left there, layer by layer."""
        if slot >= self.when.shape[-1]:
            return []
        when = self.when[..., slot]
        hit = (when >= start) & (when < (stop if stop is not None else torch.iinfo(torch.int32).max))
        return [self._why(slot, layer, head) for layer, head in hit.nonzero().tolist()]
