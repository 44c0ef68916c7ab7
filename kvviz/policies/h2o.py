"""H2O — Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs" (NeurIPS 2023).

Per layer and KV head: keeps the slots with the largest accumulated attention received from all queries so far
("heavy hitters") plus a recent window; the paper splits the budget equally, so ``recent_fraction`` = 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, Policy, protect


@dataclass(frozen=True)
class H2O(Policy):
    name = "h2o"
    accumulates = True

    recent_fraction: float = 0.5  # share of the budget kept for the most recent slots

    def __post_init__(self) -> None:
        if not 0 <= self.recent_fraction <= 1:
            raise KvvizError(f"h2o's recent_fraction must be in [0, 1], got {self.recent_fraction!r}")

    def protected(self, at: int, keep: int) -> int:
        return min(int(keep * self.recent_fraction), at)

    def score(self, candidates: Candidates) -> torch.Tensor:
        at, accumulated = candidates.at, candidates.accumulated()  # (L, KV, at)
        recent = self.protected(at, candidates.keep)
        return protect(accumulated, slice(at - recent, at)) if recent else accumulated
