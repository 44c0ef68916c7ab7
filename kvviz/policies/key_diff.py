"""KeyDiff — Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
Resource-Constrained Environments" (2025, arXiv:2504.15364).

Per layer and KV head: keeps the slots whose (post-RoPE) keys are the *least* similar to the anchor, the mean of the
candidates' unit-normalised keys — distinctive keys are kept, keys like all the others go first. The score is
``−cos(k_i, mean_j k_j/‖k_j‖)`` over the alive candidates, as kvpress' ``KeyDiffPress`` computes it over the prompt.
``ties="topk"`` keeps among equal scores what ``torch.topk`` keeps, as kvpress does. (The paper evicts block by block
as a long prompt streams in; kvpress reproduces that with its ``BlockPress`` wrapper, which kvviz does not.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional

from kvviz.policies.base import Candidates, TopkTies


@dataclass(frozen=True)
class KeyDiff(TopkTies):
    name = "key_diff"

    def score(self, candidates: Candidates) -> torch.Tensor:
        scores = []
        for layer in range(candidates.session.lm.layers):
            keys = candidates.keys(layer).float()  # (KV, at, D)
            alive = candidates.alive[layer].to(keys.device)  # (KV, at)
            unit = functional.normalize(keys, p=2, dim=-1)
            anchor = unit.mean(1, keepdim=True) if bool(alive.all()) else (  # (KV, 1, D), kvpress' mean
                (unit * alive[..., None]).sum(1, keepdim=True) / alive.sum(1).clamp(min=1)[:, None, None])
            scores.append(-functional.cosine_similarity(keys, anchor, dim=-1).cpu())
        return torch.stack(scores)  # (L, KV, at)
