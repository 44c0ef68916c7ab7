"""Key norm — Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression" (EMNLP 2024).

Per layer and KV head: keeps the slots whose (post-RoPE) keys have the *lowest* L2 norm, which the paper finds
correlate with high attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, Policy


@dataclass(frozen=True)
class KeyNorm(Policy):
    name = "key_norm"

    def score(self, candidates: Candidates) -> torch.Tensor:
        layers = candidates.session.lm.layers
        return -torch.stack([candidates.keys(layer).float().norm(dim=-1) for layer in range(layers)])  # (L, KV, at)
