"""Random eviction (seeded): the baseline every policy should beat; the same choice for every layer and head."""

from __future__ import annotations

import torch

from kvviz.policies.base import Policy


class RandomPolicy(Policy):
    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def scores(self, session, at, keep):
        return torch.rand(1, 1, at, generator=torch.Generator().manual_seed(self.seed))
