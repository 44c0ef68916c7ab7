"""The largest error a quantizer (kvviz.quant.quantizer) can leave in each element: the bound its round trip must keep (the
tests' property, docs/math.md §4)."""

from __future__ import annotations

from dataclasses import replace

import torch

from kvviz.quant.outliers import hadamard, rest_channels
from kvviz.rope import rope_rotate
from kvviz.quant.quantizer import Quantizer

_TINY = torch.finfo(torch.float32).tiny


def error_bound(x: torch.Tensor, bits: int, quantizer: Quantizer, layer: int | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
    """The largest possible round-to-nearest error of each element of ``x`` ``(KV, n, D)``: half its group's scale
    (FP8: half the format's spacing at the element, ``2^(e − m − 1)·scale`` for ``m`` mantissa bits and the element's
    binary exponent ``e``, no lower than the smallest normal's; with static scales (of ``layer``), plus what
    saturation cuts off, ``|x| − max · scale`` where positive; keys rounded before RoPE (at ``positions``): the
    pre-RoPE bounds of each channel pair, ``√(b_i² + b_{i+D/2}²)`` — a rotation keeps a pair's length — plus the
    float32 rounding of the two rotations, 8u of the pair's magnitudes)."""
    if quantizer.rope is not None:
        theta = torch.tensor(quantizer.rope, dtype=torch.float32, device=x.device)
        inner = error_bound(rope_rotate(x.float(), -positions, theta), bits, replace(quantizer, rope=None), layer)
        half = x.shape[-1] // 2
        pair = torch.hypot(inner[..., :half], inner[..., half:]).repeat(1, 1, 2)
        size = (x[..., :half].abs() + x[..., half:].abs()).float().repeat(1, 1, 2)
        return pair + 8 * 2.0**-24 * (size + 2 * pair)
    if quantizer.rotation == "hadamard":  # e = e_r·H: |e_i| ≤ Σ_j |e_r,j|·|H_ji| = Σ_j |e_r,j| / √D
        rotated = error_bound(x.float() @ hadamard(x.shape[-1], x.device), bits, quantizer.plain)
        return (rotated.sum(-1, keepdim=True) / x.shape[-1] ** 0.5).expand(x.shape).clone()
    if quantizer.outliers:
        rest = rest_channels(x.float(), quantizer.outliers)
        index = rest[:, None].expand(-1, x.shape[1], -1)
        bound = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return bound.scatter_(-1, index, error_bound(x.float().gather(-1, index), bits, quantizer.plain))
    values = x.float()
    if quantizer.axis == "token":
        kv, n, dim = values.shape
        values = values.reshape(kv, n, quantizer.groups_per_slot(dim), -1)
        reduce_dim = -1
    else:
        reduce_dim = {"channel": 1, "head": (1, 2), "tensor": (0, 1, 2)}[quantizer.axis]
    if quantizer.fp8 is not None:
        info, mantissa = torch.finfo(quantizer.fp8), {"e4m3": 3, "e5m2": 2}[quantizer.format]
        if quantizer.scales is not None:
            scale = quantizer.static_scale(x.shape[0], layer, x.device)
            cut = (values.abs() - info.max * scale).clamp_min(0)  # saturated: the part past the largest code
        else:
            scale = (values.abs().amax(reduce_dim, keepdim=True) / info.max).clamp_min(_TINY)
            cut = 0
        exponent = torch.log2((values / scale).abs().clamp(info.smallest_normal, info.max)).floor()
        return (torch.exp2(exponent - mantissa - 1) * scale + cut).expand_as(values).reshape(x.shape)
    if quantizer.symmetric:
        half = values.abs().amax(reduce_dim, keepdim=True) / (2 ** (bits - 1) - 1) / 2
    else:
        half = (values.amax(reduce_dim, keepdim=True) - values.amin(reduce_dim, keepdim=True)) / (2**bits - 1) / 2
    return half.expand_as(values).reshape(x.shape)
