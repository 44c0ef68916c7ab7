"""SnapKV — Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation" (NeurIPS 2024).

Per layer and KV head: the attention that the last ``window`` queries (the observation window) pay to each earlier
slot, smoothed by 1-D pooling over neighbouring slots before the window (``kernel``, max pooling), picks what to
keep; the window itself is kept too (all of it while it fits in half the budget; with a smaller budget, its most
recent half-budget, the rest of it competing with its own votes, unpooled). As in SnapKV's code, the pooling sees
only the columns before the window, so the window's attention to itself does not leak into the slots just before
it. Defaults here: window 32, kernel 7, max pooling.

kvpress' ``SnapKVPress`` (window 64, kernel 5) is ``pooling="avg"`` (zero-padded average, as ``F.avg_pool1d``) with
``window_kept="all"``: the whole window is kept (as SnapKV's own code does), the rest of the budget goes to the best
pooled slots before it. kvpress averages the votes over the window's rows and a group's query heads where kvviz sums
them: the same order of slots, and ``votes="mean"`` divides by the window's rows and the group's heads to give
kvpress' very scores (the scale kvpress' wrappers pad the window in).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, Policy, checked_choices, choice, positive, protect


@dataclass(frozen=True)
class SnapKV(Policy):
    name = "snapkv"

    window: int = 32  # the last prompt queries that vote
    kernel: int = 7  # width of the pooling over neighbouring slots
    pooling: str = choice("max", "avg")  # max, or avg (kvpress: zero-padded average)
    window_kept: str = choice("half", "all")  # the window while it fits in half the budget, or always (kvpress)
    votes: str = choice("sum", "mean")  # summed over the window's rows and a group's heads, or averaged (kvpress)

    def __post_init__(self) -> None:
        positive(self, "window", "kernel")
        if self.kernel % 2 == 0:
            raise KvvizError(f"{self.name}'s kernel must be odd (centred pooling), got {self.kernel}")
        checked_choices(self)

    def protected(self, at: int, keep: int) -> int:
        window = min(self.window, at)
        return window if self.window_kept == "all" else min(window, keep // 2)

    def score(self, candidates: Candidates) -> torch.Tensor:
        at = candidates.at
        window = min(self.window, at)
        votes = candidates.attention(slice(at - window, at))  # (L, KV, at)
        before = votes[..., : at - window]
        if before.shape[-1]:
            pool = torch.nn.functional.max_pool1d if self.pooling == "max" else torch.nn.functional.avg_pool1d
            before = pool(before, self.kernel, stride=1, padding=self.kernel // 2)
        pooled = torch.cat([before, votes[..., at - window:]], -1)
        if self.votes == "mean":  # kvpress' scale: what a wrapper that pads the window in it (ChunkKV, CriticalKV) sees
            lm = candidates.session.lm
            pooled = pooled / (window * (lm.heads // lm.kv_heads))
        recent = self.protected(at, candidates.keep)
        return protect(pooled, slice(at - recent, at)) if recent else pooled
