"""TOVA — Oren et al., "Transformers are Multi-State RNNs" (EMNLP 2024).

Per layer: keeps the slots with the highest attention from the newest query (here the slot just before the step),
averaged over all heads of the layer — the paper's head-averaged variant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Policy, received_attention
from kvviz.session import Session


@dataclass(frozen=True)
class TOVA(Policy):
    name = "tova"

    def scores(self, session: Session, at: int, keep: int) -> torch.Tensor:
        if at == 0:
            return received_attention(session, at, slice(0, 0)).sum(1, keepdim=True)
        return received_attention(session, at, slice(at - 1, at)).sum(1, keepdim=True)  # (L, 1, at)
