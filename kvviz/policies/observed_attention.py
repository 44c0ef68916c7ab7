"""Observed attention — the mean attention each slot received from the queries that saw it; kvpress'
``ObservedAttentionPress``, the score of H2O (Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative
Inference of LLMs", NeurIPS 2023) divided by how many queries could attend to the slot, with no recent window.

Per layer and KV head: slot ``j`` of ``at`` candidates was seen by the ``at − j`` queries ``j .. at−1`` (causal);
its score is the attention they paid it, summed over them and a group's query heads, over ``at − j`` (kvpress
averages the group's heads where kvviz sums them: the same order of slots).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, Policy


@dataclass(frozen=True)
class ObservedAttention(Policy):
    name = "observed_attention"
    accumulates = True

    def score(self, candidates: Candidates) -> torch.Tensor:
        at = candidates.at
        seen_by = torch.arange(at, 0, -1, dtype=torch.float32)  # (at,) queries j .. at−1
        return candidates.accumulated() / seen_by
