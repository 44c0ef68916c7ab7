"""Random eviction (seeded): the baseline every policy should beat; the same choice for every layer and head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, Policy


@dataclass(frozen=True)
class RandomPolicy(Policy):
    name = "random"
    uniform = True

    seed: int = 0

    def score(self, candidates: Candidates) -> torch.Tensor:
        return torch.rand(1, 1, candidates.at, generator=torch.Generator().manual_seed(self.seed))
