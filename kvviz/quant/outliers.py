"""How kvviz's quantizers handle outlier channels (docs/math.md §4): a Hadamard rotation of the head dimension before
rounding (QuaRot), the largest channels per KV head kept exact (KVQuant's dense-and-sparse split, per channel), and
keys rounded before RoPE (KVQuant's pre-RoPE keys: RoPE mixes each channel pair by a position-dependent angle, which
smears a channel's outliers over its pair; the rotation itself is kvviz.rope's). The quantizers themselves are in
kvviz.quant.quantizer."""

from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=8)
def _hadamard(dim: int, device: str) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < dim:  # Sylvester: [[H, H], [H, −H]]
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / dim**0.5).to(device)


def hadamard(dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix ``(dim, dim)`` float32: symmetric and orthogonal (``H·H = I``);
    ``dim`` a power of two."""
    return _hadamard(dim, str(device))


def rest_channels(x: torch.Tensor, outliers: int) -> torch.Tensor:
    """Per KV head, the channels of ``x`` ``(KV, n, D)`` other than the ``outliers`` with the largest max |x| over
    the slots (ties: the lower channel is the outlier), ascending: long ``(KV, D − outliers)``."""
    peak = x.abs().amax(1)  # (KV, D)
    order = torch.sort(peak, dim=-1, descending=True, stable=True).indices
    return order[:, outliers:].sort(-1).values

