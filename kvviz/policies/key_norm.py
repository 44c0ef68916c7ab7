"""Key norm — Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression" (EMNLP 2024).

Per layer and KV head: keeps the slots whose (post-RoPE) keys have the *lowest* L2 norm, which the paper finds
correlate with high attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, TopkTies


@dataclass(frozen=True)
class KeyNorm(TopkTies):
    """``ties="topk"``: among equal norms, the slots ``torch.topk`` keeps — a token repeated in the prompt has the
    same key norm at every position in the first layers (RoPE keeps norms), and kvpress' ``KnormPress`` keeps
    whichever of them ``topk`` returns."""

    name = "key_norm"

    def score(self, candidates: Candidates) -> torch.Tensor:
        layers = candidates.session.lm.layers
        return -torch.stack([torch.linalg.vector_norm(candidates.keys(layer), dim=-1, dtype=torch.float32)
                             for layer in range(layers)])  # (L, KV, at)
