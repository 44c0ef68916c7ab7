"""SnapKV — Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation" (NeurIPS 2024).

Per layer and KV head: the attention that the last ``window`` queries (the observation window) pay to each earlier
slot, smoothed by 1-D pooling over neighbouring slots (``kernel``, max pooling), picks what to keep; the window itself
is kept too (all of it while it fits in half the budget; with a smaller budget, its most recent half-budget).
Defaults here: window 32, kernel 7, max pooling.
"""

from __future__ import annotations

import torch

from kvviz.policies.base import Policy, protect, received_attention


class SnapKV(Policy):
    name = "snapkv"
    per_head = True

    def __init__(self, window: int = 32, kernel: int = 7):
        self.window, self.kernel = window, kernel

    def scores(self, session, at, keep):
        window = min(self.window, at)
        votes = received_attention(session, at, slice(at - window, at))  # (L, KV, at)
        pooled = torch.nn.functional.max_pool1d(votes, self.kernel, stride=1, padding=self.kernel // 2)
        recent = min(window, keep // 2)
        return protect(pooled, slice(at - recent, at)) if recent else pooled
