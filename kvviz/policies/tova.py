"""TOVA — Oren et al., "Transformers are Multi-State RNNs" (EMNLP 2024).

Per layer: keeps the slots with the highest attention from the newest query (here the slot just before the step),
averaged over all heads of the layer — the paper's head-averaged variant. ``keep_last`` always keeps that newest
slot as well, as kvpress' ``TOVAPress`` does (it scores it above every other).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, Policy, protect


@dataclass(frozen=True)
class TOVA(Policy):
    name = "tova"

    keep_last: bool = False  # always keep the newest slot (kvpress)

    def protected(self, at: int, keep: int) -> int:
        return int(self.keep_last and at > 0)

    def score(self, candidates: Candidates) -> torch.Tensor:
        at = candidates.at
        scores = candidates.attention(slice(max(at - 1, 0), at)).sum(1, keepdim=True)  # (L, 1, at)
        return protect(scores, slice(at - 1, at)) if self.keep_last and at else scores
