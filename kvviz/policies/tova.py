"""TOVA — Oren et al., "Transformers are Multi-State RNNs" (EMNLP 2024).

Per layer: keeps the slots with the highest attention from the newest query (here the slot just before the step),
averaged over all heads of the layer — the paper's head-averaged variant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, Policy


@dataclass(frozen=True)
class TOVA(Policy):
    name = "tova"

    def score(self, candidates: Candidates) -> torch.Tensor:
        at = candidates.at
        return candidates.attention(slice(max(at - 1, 0), at)).sum(1, keepdim=True)  # (L, 1, at)
