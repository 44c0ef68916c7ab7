"""PyramidKV — Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling" (2024).

SnapKV's scores with layer-wise budgets: lower layers attend broadly and keep more, upper layers keep fewer. Budgets
fall linearly from ``2k − k/β`` in the first layer to ``k/β`` in the last, so that their mean is the budget ``k``
(the paper's β = 20). No layer keeps more than the ``n`` candidates or fewer than one slot: where the line leaves
that range (large budgets, above about k = n/2) the slots it cannot place go to the other layers, one at a time in
passes from the lowest layer, so the mean stays exactly ``k`` (``n·L`` and ``L`` bound it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.policies.base import Candidates, choice, positive
from kvviz.policies.snapkv import SnapKV


@dataclass(frozen=True)
class PyramidKV(SnapKV):
    name = "pyramid_kv"

    beta: float = 20.0  # the last layer keeps budget / beta
    schedule: str = choice("linear", "kvpress")  # the paper's line (mean k), or KVCache-Factory's (kvpress)

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "beta")

    def budgets(self, candidates: Candidates, scores: torch.Tensor) -> torch.Tensor:
        layers, heads, at = scores.shape
        if self.schedule == "kvpress":
            kept = at * candidates.share if candidates.share is not None else candidates.keep
            per_layer = torch.tensor(kvpress_pyramid(at, kept, self.window, self.beta, layers))
        else:
            per_layer = pyramid(candidates.keep, layers, self.beta, at)
        return per_layer[:, None].expand(layers, heads)


def kvpress_pyramid(n: int, kept: float, window: int, beta: float, layers: int) -> list[int]:
    """kvpress' ``PyramidKVPress.get_layer_budget`` (after KVCache-Factory), for ``n`` slots of which ``kept``
    (``n·(1 − ratio)``, a float) are to stay on average: a line from ``2·kept − kept/β`` down to ``kept/β`` with the
    first layer capped at ``n − window`` (the last then keeps the rest), every layer at least the window; where that
    cannot hold, every layer keeps ``max(1, round(kept))`` (plain SnapKV). Python's rounding, as kvpress."""
    capacity = window + kept
    low = (capacity - window) / beta
    high = (capacity - window) * 2 - low
    if high >= n - window:
        high = n - window
        low = (capacity - window) * 2 - high
    if not n >= high >= low >= window:
        return [max(1, round(kept))] * layers
    steps = (high - low) / (layers - 1) if layers > 1 else 0.0
    return [round(high - layer * steps) for layer in range(layers)]


def pyramid(keep: int, layers: int, beta: float, most: int) -> torch.Tensor:
    """Per-layer budgets ``(layers,)``: the line from ``2k − k/β`` down to ``k/β``, rounded, each within
    ``[1, most]``, summing to ``keep · layers`` (clamped to what fits): what rounding and the bounds moved is handed
    out one slot at a time, in passes over the layers that still have room, the lowest layer first."""
    top, bottom = 2 * keep - keep / beta, keep / beta
    depth = torch.arange(layers, dtype=torch.float64)
    budgets = (top - (top - bottom) * depth / max(layers - 1, 1)).round().long().clamp(1, most)
    missing = min(max(keep * layers, layers), most * layers) - int(budgets.sum())
    if missing > 0:
        return budgets + round_robin(most - budgets, missing)
    return budgets - round_robin(budgets - 1, -missing)


def round_robin(room: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` units dealt one at a time in passes over the entries with room left, the first entry first: how
    many each of ``room`` ``(n,)`` gets (never more than its room; ``count`` ≤ the total room)."""
    low, high = 0, int(room.max()) if room.numel() else 0  # the last pass every entry with room completes
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if int(room.clamp(max=middle).sum()) <= count else (low, middle - 1)
    dealt = room.clamp(max=low)
    rest = count - int(dealt.sum())
    dealt[(room > low).nonzero()[:rest, 0]] += 1
    return dealt
