"""Random eviction (seeded): the baseline every policy should beat; the same choice for every layer and head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Policy
from kvviz.session import Session


@dataclass(frozen=True)
class RandomPolicy(Policy):
    name = "random"

    seed: int = 0

    def scores(self, session: Session, at: int, keep: int) -> torch.Tensor:
        return torch.rand(1, 1, at, generator=torch.Generator().manual_seed(self.seed))
