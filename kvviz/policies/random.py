"""Random eviction (seeded): the baseline every policy should beat; the same choice for every layer and head, or with
``per_head`` one draw per KV head (the same in every layer), as kvpress' ``RandomPress`` draws
``torch.rand(batch, KV heads, n)`` from a generator seeded anew in each layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, Policy


@dataclass(frozen=True)
class RandomPolicy(Policy):
    name = "random"

    seed: int = 0
    per_head: bool = False  # one draw per KV head (kvpress) instead of one for all

    @property
    def uniform(self) -> bool:  # type: ignore[override]
        return not self.per_head

    def score(self, candidates: Candidates) -> torch.Tensor:
        heads = candidates.session.lm.kv_heads if self.per_head else 1
        return torch.rand(1, heads, candidates.at, generator=torch.Generator().manual_seed(self.seed))
