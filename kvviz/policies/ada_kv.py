"""AdaKV — Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation" (2024).

SnapKV's scores with head-adaptive budgets: each layer keeps ``budget × KV heads`` slots in all, chosen by score
across its KV heads at once, so heads whose attention is concentrated give room to heads whose attention is spread. A
safeguard keeps at least ``floor`` × budget slots (and one) in every head (the paper's α = 0.2). With SnapKV's kvpress
settings (``pooling="avg"``, ``window_kept="all"``) it is kvpress' ``AdaKVPress(SnapKVPress())``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, keep_rank
from kvviz.policies.snapkv import SnapKV


@dataclass(frozen=True)
class AdaKV(SnapKV):
    name = "ada_kv"

    floor: float = 0.2  # share of the budget every KV head keeps whatever its scores

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.floor, bool) or not isinstance(self.floor, (int, float)) or not 0 <= self.floor <= 1:
            raise KvvizError(f"ada_kv's floor must be in [0, 1], got {self.floor!r}")

    def budgets(self, candidates: Candidates, scores: torch.Tensor) -> torch.Tensor:
        layers, heads, at = scores.shape
        keep = candidates.keep
        floor = max(1, int(keep * self.floor)) if self.floor > 0 else 0  # at least one slot, as kvpress
        guaranteed = keep_rank(scores) < floor  # (L, KV, at): every head's best ``floor`` slots
        rest = scores.masked_fill(guaranteed, float("-inf")).flatten(1)  # (L, KV·at): the others compete per layer
        shared = min(keep * heads - floor * heads, rest.shape[1])
        chosen = torch.zeros_like(rest, dtype=torch.bool)
        chosen.scatter_(1, torch.topk(rest, shared, dim=1, sorted=False).indices, True)
        chosen &= rest > float("-inf")
        return floor + chosen.view(layers, heads, at).sum(-1)
