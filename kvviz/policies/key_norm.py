"""Key norm — Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression" (EMNLP 2024).

Per layer and KV head: keeps the slots whose (post-RoPE) keys have the *lowest* L2 norm, which the paper finds
correlate with high attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, Policy, checked_choices, choice, topk_ties
from kvviz.policies.decision import Decision


@dataclass(frozen=True)
class KeyNorm(Policy):
    name = "key_norm"

    ties: str = choice("earlier", "topk")  # among equal norms keep the earlier slot, or torch.topk's (kvpress)

    def __post_init__(self) -> None:
        checked_choices(self)

    def score(self, candidates: Candidates) -> torch.Tensor:
        layers = candidates.session.lm.layers
        return -torch.stack([torch.linalg.vector_norm(candidates.keys(layer), dim=-1, dtype=torch.float32)
                             for layer in range(layers)])  # (L, KV, at)

    def decide(self, candidates: Candidates) -> Decision:
        """As the base, or with ``ties="topk"`` the slots ``torch.topk`` keeps: a token repeated in the prompt has
        the same key norm at every position in the first layers (RoPE keeps norms), and kvpress' ``KnormPress``
        keeps whichever of them ``topk`` returns."""
        decision = super().decide(candidates)
        return decision if self.ties == "earlier" else topk_ties(decision, candidates.keep)
