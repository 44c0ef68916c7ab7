"""SnapKV — Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation" (NeurIPS 2024).

Per layer and KV head: the attention that the last ``window`` queries (the observation window) pay to each earlier
slot, smoothed by 1-D pooling over neighbouring slots before the window (``kernel``, max pooling), picks what to
keep; the window itself is kept too (all of it while it fits in half the budget; with a smaller budget, its most
recent half-budget, the rest of it competing with its own votes, unpooled). As in SnapKV's code, the pooling sees
only the columns before the window, so the window's attention to itself does not leak into the slots just before
it. Defaults here: window 32, kernel 7, max pooling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, Policy, positive, protect


@dataclass(frozen=True)
class SnapKV(Policy):
    name = "snapkv"

    window: int = 32  # the last prompt queries that vote
    kernel: int = 7  # width of the max pooling over neighbouring slots

    def __post_init__(self) -> None:
        positive(self, "window", "kernel")
        if self.kernel % 2 == 0:
            raise KvvizError(f"snapkv's kernel must be odd (centred pooling), got {self.kernel}")

    def score(self, candidates: Candidates) -> torch.Tensor:
        at = candidates.at
        window = min(self.window, at)
        votes = candidates.attention(slice(at - window, at))  # (L, KV, at)
        before = votes[..., : at - window]
        if before.shape[-1]:
            before = torch.nn.functional.max_pool1d(before, self.kernel, stride=1, padding=self.kernel // 2)
        pooled = torch.cat([before, votes[..., at - window:]], -1)
        recent = min(window, candidates.keep // 2)
        return protect(pooled, slice(at - recent, at)) if recent else pooled
