"""4-bit float (E2M1) block formats for cached keys and values (docs/math.md §4): NVFP4 and MXFP4.

Every element is an E2M1 float — sign, 2 exponent bits, 1 mantissa bit: ``0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6`` —
times the scale of its block of consecutive channels of one slot and KV head:

- ``nvfp4`` (NVIDIA; vLLM ``kv_cache_dtype="nvfp4"``, TensorRT-LLM's NVFP4 KV cache): blocks of 16, each with an
  FP8 E4M3 scale, over one FP32 scale per tensor (here: per layer, for keys and for values). As torchao's
  ``nvfp4_quantize`` with a per-tensor scale: ``g = amax(tensor) / (448 · 6)``, block scale
  ``s = e4m3(clamp(amax(block) / 6 / g, 2⁻⁶, 448))``, element ``e2m1(clamp(x · ((1 / g) / s), ±6))``, read back as
  ``e2m1 · (g · s)``.
- ``nvfp4-4over6`` (vLLM ``nvfp4_4over6``): per block, the scale that maps the block's largest value to 6 or the one
  that maps it to 4, whichever gives the smaller squared error over the block (ties: 6).
- ``mxfp4`` (OCP Microscaling v1.0; SGLang ``fp4_e2m1`` with blocks of 16): blocks of 32, each with a power-of-two
  (E8M0) scale ``2^(⌊log₂ amax(block)⌋ − 2)`` (OCP's rule, torchao's ``ScaleCalculationMode.FLOOR``), at least
  ``2⁻¹²⁶``; elements past ±6 after scaling saturate (OCP's known clipping of the block's top values).

Rounding to E2M1 is to the nearest value, ties to an even mantissa, as torchao's ``f32_to_f4_unpacked``.
"""

from __future__ import annotations

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_TINY = 2.0 ** -6  # the smallest normal E4M3 value: torchao's lower clamp of a block scale
F32_MIN_NORMAL = 2.0 ** -126
FP4_BLOCKS = {"nvfp4": 16, "nvfp4-4over6": 16, "mxfp4": 32}  # each format's standard block of channels
_TINY = torch.finfo(torch.float32).tiny


def e2m1_(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32, any shape) rounded in place to E2M1 — saturated at ±6, then to the nearest value with ties to
    an even mantissa: the step is 0.5 below 2, 1 below 4, 2 up to 6, and ``torch.round`` rounds half to even."""
    x.clamp_(-E2M1_MAX, E2M1_MAX)
    size = x.abs()
    step = torch.where(size < 2, 0.5, torch.where(size < 4, 1.0, 2.0))
    return x.div_(step).round_().mul_(step)


def fp4_round_trip_(out: torch.Tensor, values: torch.Tensor, format: str, tensor: torch.Tensor | None = None) -> None:
    """``out`` ← ``values`` through ``format`` (a key of :data:`FP4_BLOCKS`); both float32 ``(..., blocks, block)``:
    one block per last-axis row. NVFP4's tensor scale is ``tensor`` (static, broadcast against ``values``, e.g.
    ``(KV, 1, 1, 1)``), or by default dynamic: from the amax of the whole of ``values``. Under a static tensor scale
    a block whose scale would pass E4M3's 448 is clamped there, and its largest elements saturate at ``6 · 448 · g``."""
    amax = values.abs().amax(-1, keepdim=True)  # (..., blocks, 1)
    if format == "mxfp4":
        exponent = torch.frexp(amax)[1] - 1  # ⌊log₂ amax⌋ for amax > 0 (amax = 0 reads back 0 with any scale)
        scale = torch.pow(2.0, (exponent - 2).clamp_(-127, 127).float()).clamp_(min=F32_MIN_NORMAL)
        torch.div(values, scale, out=out)
        e2m1_(out).mul_(scale)
        return
    if tensor is None:
        tensor = (amax.amax() / (E4M3_MAX * E2M1_MAX)).clamp_(min=_TINY)
    first = _nvfp4(values, amax / E2M1_MAX, tensor)
    if format == "nvfp4":
        out.copy_(first)
        return
    second = _nvfp4(values, amax / 4.0, tensor)
    worse = (first - values).square_().sum(-1, keepdim=True) > (second - values).square_().sum(-1, keepdim=True)
    torch.where(worse, second, first, out=out)


def _nvfp4(values: torch.Tensor, block: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """``values`` ``(..., blocks, block)`` read back from NVFP4 with block scales ``block / tensor`` (before their
    E4M3 rounding) under the tensor scale ``tensor`` (0-d or broadcast), in torchao's order of operations."""
    scale = (block / tensor).clamp_(E4M3_TINY, E4M3_MAX).to(torch.float8_e4m3fn).float()
    codes = e2m1_(values * ((1.0 / tensor) / scale))
    return codes.mul_(tensor * scale)
