"""Key norm — Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression" (EMNLP 2024).

Per layer and KV head: keeps the slots whose (post-RoPE) keys have the *lowest* L2 norm, which the paper finds
correlate with high attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Policy
from kvviz.session import Session


@dataclass(frozen=True)
class KeyNorm(Policy):
    name = "key_norm"

    def scores(self, session: Session, at: int, keep: int) -> torch.Tensor:
        norms = [session.commits.original_kv(layer, at)[0].float().norm(dim=-1) for layer in range(session.lm.layers)]
        return -torch.stack(norms).cpu()  # (L, KV, at)
