"""How kvviz's quantizers handle outlier channels (docs/math.md §4): a Hadamard rotation of the head dimension before
rounding (QuaRot), the largest channels per KV head kept exact (KVQuant's dense-and-sparse split, per channel), and
keys rounded before RoPE (KVQuant's pre-RoPE keys: RoPE mixes each channel pair by a position-dependent angle, which
smears a channel's outliers over its pair). The quantizers themselves are in kvviz.quant."""

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


def rope_rotate(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., n, D)`` rotated by ``delta`` ``(n,)`` positions each, with RoPE frequencies ``inv_freq``
    ``(D/2,)``: channel pair ``(x_i, x_{i+D/2})`` turned by the angle ``δ·θ_i`` (transformers' ``rotate_half`` layout,
    float32 angles as the model computes them). A negative ``delta`` undoes a rotation."""
    freqs = delta.to(inv_freq.device, torch.float32)[:, None] * inv_freq  # (n, D/2)
    emb = torch.cat((freqs, freqs), dim=-1).to(x.device)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated_half * sin
