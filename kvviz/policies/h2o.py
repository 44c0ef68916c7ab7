"""H2O — Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs" (NeurIPS 2023).

Per layer and KV head: keeps the slots with the largest accumulated attention received from all queries so far
("heavy hitters") plus a recent window; the paper splits the budget equally, so ``recent_fraction`` = 0.5.
"""

from __future__ import annotations

from kvviz.policies.base import Policy, protect, received_attention


class H2O(Policy):
    name = "h2o"
    per_head = True

    def __init__(self, recent_fraction: float = 0.5):
        self.recent_fraction = recent_fraction

    def scores(self, session, at, keep):
        accumulated = received_attention(session, at, slice(0, at))
        recent = int(keep * self.recent_fraction)
        return protect(accumulated, slice(at - recent, at)) if recent else accumulated
