"""PyramidKV — Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling" (2024).

SnapKV's scores with layer-wise budgets: lower layers attend broadly and keep more, upper layers keep fewer. Budgets
fall linearly from ``2k − k/β`` in the first layer to ``k/β`` in the last, so that their mean is the budget ``k``
(the paper's β = 20).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, positive
from kvviz.policies.snapkv import SnapKV


@dataclass(frozen=True)
class PyramidKV(SnapKV):
    name = "pyramid_kv"

    beta: float = 20.0  # the last layer keeps budget / beta

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "beta")

    def budgets(self, candidates: Candidates, scores: torch.Tensor) -> torch.Tensor:
        layers, heads, _ = scores.shape
        keep = candidates.keep
        top, bottom = 2 * keep - keep / self.beta, keep / self.beta
        steps = torch.linspace(0, 1, layers, dtype=torch.float64) if layers > 1 else torch.zeros(1, dtype=torch.float64)
        per_layer = (top - (top - bottom) * steps).round().long().clamp(min=1)
        return per_layer[:, None].expand(layers, heads)
