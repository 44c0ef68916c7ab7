"""Quantizers for cached keys and values (docs/math.md §4), and the bytes they really take when packed.

Granularity, KIVI style: ``channel`` shares one scale (and zero point) per (KV head, channel) across the quantized
slots — keys have outlier channels, so this suits them; with ``block`` = G, KIVI's token-blocked groups: one scale per
(KV head, channel, block of G slots ``bG..bG+G-1``). ``token`` shares one per (KV head, slot, group of ``group_size``
channels) — this suits values. ``head`` shares one per KV head over the slots quantized together (an FP8 cache's
per-head scale), ``tensor`` one per layer over its KV heads too (vLLM's per-layer ``k_scale`` / ``v_scale``). Formats: ``int`` — uniform codes, scales and zero points stored as fp16; ``e4m3`` / ``e5m2`` —
FP8, the engines' KV-cache dtypes (vLLM's ``kv_cache_dtype="fp8_e4m3"`` / ``"fp8_e5m2"``): ``x ≈ scale · fp8(x /
scale)`` with ``scale = amax / max(format)`` over the group (dynamic scaling), torch's own float8 casts (round to
nearest even, saturating at the format's maximum), 8 bits per element and one float32 scale per group. An FP8
quantizer per KV head or per layer may instead hold *static* scales (``scales``: per layer, one per KV head), calibrated
beforehand as vLLM's ``k_scale`` / ``v_scale`` are (kvviz.schemes.calibration); a value past ``scale · max(format)`` then
saturates. ``e4m3-ue8m0``: E4M3 with each group's scale rounded up to a power of two,
``2^⌈log₂ max(amax / 448, 10⁻⁴)⌉`` (stored as a float32), as DeepSeek's FlashMLA quantizes a latent cache
(``quantize_k_cache``, vLLM's ``fp8_ds_mla``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from kvviz.errors import KvvizError
from kvviz.quant.fp4 import FP4_BLOCKS, fp4_round_trip_
from kvviz.quant.outliers import hadamard, rest_channels
from kvviz.rope import rope_rotate

SUPPORTED_BITS = (16, 8, 4, 3, 2)
Axis = Literal["channel", "token", "head", "tensor"]
FORMATS = {"int": None, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
           "e4m3-ue8m0": torch.float8_e4m3fn} | dict.fromkeys(FP4_BLOCKS)
SCALE_FLOOR = 1e-4  # FlashMLA's FP8_AMAX_MARGIN: the least amax / max(format) a power-of-two (UE8M0) scale rounds up
PARAM_BYTES = 2  # one fp16 scale or zero point
FP8_SCALE_BYTES = 4  # one float32 scale (as vLLM keeps k_scale / v_scale)
FP4_SCALE_BYTES = 1  # one E4M3 (NVFP4) or E8M0 (MXFP4) scale per block
_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class Quantizer:
    """How to quantize one tensor kind. ``group_size`` (channels per group, for ``token``) must divide the head dim;
    ``None`` means one group over the whole head dim. ``block`` (for ``channel``): slots per scale, in blocks counted
    from slot 0 (KIVI); ``None`` shares one scale across all slots quantized together."""

    axis: Axis = "token"
    group_size: int | None = None
    symmetric: bool = False
    block: int | None = None
    format: str = "int"  # "int", FP8 "e4m3" / "e5m2", E2M1 blocks (kvviz.quant.fp4) "nvfp4" / "nvfp4-4over6" / "mxfp4"
    rotation: str = "none"  # "hadamard": rounded in the basis of a normalised Hadamard matrix (QuaRot), then back
    outliers: int = 0  # channels per KV head kept exact: the largest max |x| over the slots quantized together
    scales: tuple[tuple[float, ...], ...] | None = None  # FP8 static scales, per layer one per KV head (else dynamic)
    rope: tuple[float, ...] | None = None  # keys only: rounded before RoPE, whose frequencies θ (D/2,) these are
    no_rope: tuple[int, ...] = ()  # with rope: layers that apply no RoPE (NoPE), whose keys are rounded as stored
    fp32_scales: bool = False  # int: float32 scales (vLLM's per-token-head caches) instead of fp16

    def __post_init__(self) -> None:
        if self.axis not in ("channel", "token", "head", "tensor"):
            raise KvvizError(f"granularity must be 'channel', 'token', 'head' or 'tensor', got {self.axis!r}")
        if self.format not in FORMATS:
            raise KvvizError(f"the number format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.group_size is not None and (not isinstance(self.group_size, int) or self.group_size < 1):
            raise KvvizError(f"group size must be a positive integer, got {self.group_size!r}")
        if self.block is not None and (isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1):
            raise KvvizError(f"the block of slots must be a positive integer, got {self.block!r}")
        if self.fp4:
            if self.axis != "token" or self.symmetric:
                raise KvvizError(f"{self.format} blocks are consecutive channels of one slot and KV head: axis "
                                 "'token', scales as the format defines them")
            if self.group_size is None:
                object.__setattr__(self, "group_size", FP4_BLOCKS[self.format])
        if self.fp32_scales and self.format != "int":
            raise KvvizError("float32 scales are an int cache's option; FP8 and FP4 formats keep their own scales")
        if self.rotation not in ("none", "hadamard"):
            raise KvvizError(f"the rotation must be 'none' or 'hadamard', got {self.rotation!r}")
        if isinstance(self.outliers, bool) or not isinstance(self.outliers, int) or self.outliers < 0:
            raise KvvizError(f"the outlier channels kept must be a non-negative integer, got {self.outliers!r}")
        if self.outliers and self.rotation != "none":
            raise KvvizError("keep outlier channels or rotate (Hadamard), not both: a rotation spreads the outliers")
        if self.scales is not None:
            self._check_scales()
        if self.rope is not None:
            try:
                object.__setattr__(self, "rope", tuple(float(f) for f in self.rope))
            except TypeError:
                raise KvvizError("the RoPE frequencies of pre-RoPE keys are a list of numbers") from None
            if not self.rope or not all(0 < f < float("inf") for f in self.rope):
                raise KvvizError("the RoPE frequencies of pre-RoPE keys must be positive and finite")
        try:
            layers = tuple(sorted(set(self.no_rope)))
        except TypeError:
            raise KvvizError("the layers without RoPE are a list of layer numbers") from None
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in layers):
            raise KvvizError("the layers without RoPE are a list of layer numbers")
        object.__setattr__(self, "no_rope", layers if self.rope is not None else ())  # they matter before RoPE only

    def _check_scales(self) -> None:
        # FP8's per KV head or per layer, or NVFP4's tensor scale (per layer, one per KV head: the same in a layer)
        scaled = self.format.startswith("nvfp4") or self.fp8 is not None and self.axis in ("head", "tensor")
        if not scaled or self.rotation != "none" or self.outliers or self.rope is not None:  # calibrated post-RoPE
            raise KvvizError("static scales are for FP8 (e4m3 / e5m2) per KV head or per layer and NVFP4's tensor "
                             "scale, without a rotation, "
                             "outlier channels or pre-RoPE keys: the engines calibrate one scale per layer or KV head "
                             "on the keys as cached")
        rows = per_head_table(self.scales, float, "static scales")
        if not all(0 < s < float("inf") for row in rows for s in row):
            raise KvvizError("static scales must be positive, finite numbers")
        object.__setattr__(self, "scales", rows)

    def check(self, head_dim: int) -> None:
        if self.rope is not None and not 0 < 2 * len(self.rope) <= head_dim:  # fewer: partial RoPE (Qwen3-Next)
            raise KvvizError(f"{len(self.rope)} RoPE frequencies do not rotate a head of {head_dim} channels: take the "
                             "model's own")
        if self.outliers >= head_dim:
            raise KvvizError(f"{self.outliers} outlier channels leave none of the head's {head_dim} to quantize")
        rounded = head_dim - self.outliers  # the channels rounded
        if self.group_size is not None and rounded % self.group_size:
            raise KvvizError(f"group size {self.group_size} does not divide the head dimension {head_dim}" + (
                f" less its {self.outliers} outlier channels" if self.outliers else ""))
        if self.rotation == "hadamard" and head_dim & (head_dim - 1):
            raise KvvizError(f"a Hadamard rotation needs a power-of-two head dimension, not {head_dim}")

    def check_model(self, layers: int, kv_heads: int, head_dim: int) -> None:
        """:meth:`check`, and static scales that fit a model of ``layers`` layers and ``kv_heads`` KV heads."""
        self.check(head_dim)
        if self.scales is not None and (len(self.scales), len(self.scales[0])) != (layers, kv_heads):
            raise KvvizError(f"the static scales are for {len(self.scales)} layers of {len(self.scales[0])} KV heads; "
                             f"this model has {layers} layers of {kv_heads}: calibrate on this model")

    def static_scale(self, rows: int, layer: int | None, device: torch.device) -> torch.Tensor:
        """The static scales for ``rows`` quantized rows ``(rows, 1, 1)`` float32: the KV heads of ``layer``, or,
        with ``layer`` None, those of every layer in order (``rows`` = layers × KV heads)."""
        table = self.scales if layer is None else self.scales[layer:layer + 1]
        if layer is not None and layer >= len(self.scales) or len(table) * len(table[0]) != rows:
            raise KvvizError(f"the static scales ({len(self.scales)} layers of {len(self.scales[0])} KV heads) do not "
                             "fit this cache: calibrate on this model")
        return torch.tensor(table, dtype=torch.float32, device=device).reshape(rows, 1, 1)

    def groups_per_slot(self, head_dim: int) -> int:
        return head_dim // (self.group_size or head_dim)

    @property
    def plain(self) -> Quantizer:
        """This quantizer without its rotation or outlier channels (what rounds the rest)."""
        return replace(self, rotation="none", outliers=0, rope=None, no_rope=())

    @property
    def fp8(self) -> torch.dtype | None:
        """The float8 dtype of an FP8 format, None for integer codes and FP4."""
        return FORMATS[self.format]

    @property
    def fp4(self) -> bool:
        """Whether the format is an E2M1 block format (kvviz.quant.fp4)."""
        return self.format in FP4_BLOCKS

    @property
    def per_layer(self) -> bool:
        """Whether one scale spans a layer's KV heads (``tensor``, NVFP4's tensor scale): quantized layer by layer."""
        return self.axis == "tensor" or self.format.startswith("nvfp4")

    @property
    def scale_bytes(self) -> int:
        """Bytes of one stored scale: fp16 for int codes (float32 with ``fp32_scales``), float32 for FP8, one byte
        (E4M3 / E8M0) for FP4 blocks."""
        if self.fp4:
            return FP4_SCALE_BYTES
        return FP8_SCALE_BYTES if self.fp8 is not None or self.fp32_scales else PARAM_BYTES

    @property
    def params(self) -> int:
        """Stored numbers per group: a scale, and a zero point for asymmetric int codes."""
        return 1 if self.symmetric or self.format != "int" else 2

    def check_bits(self, bits: int) -> None:
        """Refuse a bit-width this format cannot store (FP8: 8, FP4: 4, or 16 for untouched)."""
        if self.fp8 is not None and bits not in (8, 16):
            raise KvvizError(f"FP8 ({self.format}) stores 8 bits per element; choose 8 (or 16: untouched), not {bits}")
        if self.fp4 and bits not in (4, 16):
            raise KvvizError(f"{self.format} stores 4 bits per element; choose 4 (or 16: untouched), not {bits}")


def per_head_table(rows: object, item, what: str) -> tuple[tuple, ...]:
    """``rows`` as a tuple per layer of one ``item(value)`` per KV head, the same number in every layer (static
    scales, widths per head); anything else is refused naming ``what``."""
    try:
        table = tuple(tuple(item(value) for value in row) for row in rows)
    except TypeError:
        raise KvvizError(f"{what} are a list per layer of one value per KV head") from None
    if not table or any(len(row) != len(table[0]) or not row for row in table):
        raise KvvizError(f"{what} need the same number of KV heads in every layer")
    return table


def check_bits(bits: object) -> int:
    """Return ``bits`` if supported, else refuse with the supported set."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in SUPPORTED_BITS:
        raise KvvizError(f"bit-width must be one of {', '.join(map(str, SUPPORTED_BITS))}; got {bits!r}")
    return bits


def fake_quantize(x: torch.Tensor, bits: int, quantizer: Quantizer, layer: int | None = None,
                  positions: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize then dequantize ``x`` ``(KV, n, D)`` (of ``layer``, for static scales; all layers' rows
    ``(L·KV, n, D)`` with ``layer`` None; ``positions`` ``(n,)`` of the slots, for keys rounded before RoPE) at
    ``bits``; returns a new tensor of the same shape and dtype (``x`` itself at 16 bits).

    Asymmetric: ``scale = (max − min)/(2^b − 1)``, zero point ``min``. Symmetric: ``scale = max|x|/(2^(b−1) − 1)``.
    Every element's error is at most ``scale / 2`` of its group (round to nearest).
    """
    if check_bits(bits) == 16 or x.numel() == 0:
        return x
    values = x.float()
    return fake_quantize_(torch.empty_like(values), bits, quantizer, values, layer, positions).to(x.dtype)


def fake_quantize_(
    x: torch.Tensor, bits: int, quantizer: Quantizer, source: torch.Tensor | None = None, layer: int | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`fake_quantize` in place (``x`` may be a view, e.g. some slots of a cache): ``x`` gets the round trip of
    ``source`` (same shape; default ``x`` itself) and is returned. In place saves the allocations and memory passes
    that dominate quantizing a long cache."""
    source = x if source is None else source
    if check_bits(bits) == 16 or x.numel() == 0:
        return x.copy_(source) if source is not x else x
    quantizer.check(x.shape[-1])
    quantizer.check_bits(bits)
    if x.dtype != torch.float32 or source.dtype != torch.float32:  # half precision: round trip in float32
        return x.copy_(fake_quantize(source, bits, quantizer, layer, positions))
    if quantizer.rope is not None and quantizer.no_rope and layer is None:
        raise ValueError("keys quantized before RoPE in a model with NoPE layers need their layer")
    if quantizer.rope is not None and layer in quantizer.no_rope:  # a NoPE layer's key is its key before RoPE
        return fake_quantize_(x, bits, replace(quantizer, rope=None, no_rope=()), source, layer, positions)
    if quantizer.rope is not None:  # KVQuant: back to the key before RoPE, rounded there, rotated forward again
        if positions is None:
            raise ValueError("keys quantized before RoPE need the positions of their slots")
        theta = torch.tensor(quantizer.rope, dtype=torch.float32, device=x.device)
        pre = fake_quantize_(rope_rotate(source, -positions, theta), bits, replace(quantizer, rope=None, no_rope=()),
                             None, layer)
        return x.copy_(rope_rotate(pre, positions, theta))
    if quantizer.rotation == "hadamard":  # QuaRot: round x·H, store; read back (x·H)^·H (H symmetric, H·H = I)
        h = hadamard(x.shape[-1], x.device)
        rotated = source @ h
        fake_quantize_(rotated, bits, quantizer.plain)
        return torch.matmul(rotated, h, out=x) if x.is_contiguous() else x.copy_(rotated @ h)
    if quantizer.outliers:  # the outlier channels as they are, the others rounded without them
        rest = rest_channels(source, quantizer.outliers)  # (KV, D − k) per KV head
        index = rest[:, None].expand(-1, source.shape[1], -1)
        rounded = fake_quantize(source.gather(-1, index), bits, quantizer.plain)
        if x is not source:
            x.copy_(source)
        return x.scatter_(-1, index, rounded)
    if quantizer.axis == "token":
        kv, n, dim = x.shape
        grouped = (kv, n, quantizer.groups_per_slot(dim), -1)
        out, values, reduce_dim = x.view(grouped), source.view(grouped), -1
    else:
        out, values, reduce_dim = x, source, {"channel": 1, "head": (1, 2), "tensor": (0, 1, 2)}[quantizer.axis]
    if quantizer.fp4:
        static = None if quantizer.scales is None else quantizer.static_scale(x.shape[0], layer, x.device)[..., None]
        fp4_round_trip_(out, values, quantizer.format, static)
    elif quantizer.scales is not None:
        _fp8_cast_(out, values, quantizer.fp8, quantizer.static_scale(x.shape[0], layer, x.device))
    elif quantizer.fp8 is not None:
        _fp8_round_trip_(out, values, quantizer.fp8, reduce_dim, quantizer.format.endswith("ue8m0"))
    else:
        _round_trip_(out, values, bits, quantizer.symmetric, reduce_dim)
    return x


def _fp8_round_trip_(out: torch.Tensor, values: torch.Tensor, dtype: torch.dtype, reduce_dim,
                     power_of_two: bool = False) -> None:
    """``out`` ← ``scale · fp8(values / scale)`` with ``scale = amax / max(dtype)`` per group (torch's cast: round to
    nearest even, saturating at the maximum; a group of zeros gets the smallest positive scale); ``power_of_two``:
    that scale, at least :data:`SCALE_FLOOR`, rounded up to a power of two (UE8M0)."""
    scale = values.abs().amax(reduce_dim, keepdim=True) / torch.finfo(dtype).max
    if power_of_two:
        scale = torch.exp2(scale.clamp_min_(SCALE_FLOOR).log2_().ceil_())
    _fp8_cast_(out, values, dtype, scale.clamp_min_(_TINY))


def _fp8_cast_(out: torch.Tensor, values: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> None:
    """``out`` ← ``scale · fp8(clamp(values / scale, ±max))``: saturated first, as vLLM's kernels do (torch's own
    e5m2 cast overflows to inf), then torch's cast (round to nearest even)."""
    top = torch.finfo(dtype).max
    torch.div(values, scale, out=out).clamp_(-top, top)
    out.copy_(out.to(dtype).float()).mul_(scale)


def _round_trip_(out: torch.Tensor, values: torch.Tensor, bits: int, symmetric: bool, reduce_dim: int) -> None:
    """``out`` ← ``values`` round-tripped through ``bits``-bit codes (``out`` may be ``values``: in place). No clamp
    is needed: ``|x − low| / scale`` and ``|x| / scale`` stay within the code range up to rounding, far below the
    half step that could change a code. A constant group (scale 0) gets the smallest positive scale: its codes are
    0, so it comes back exactly."""
    if symmetric:
        scale = (values.abs().amax(reduce_dim, keepdim=True) / (2 ** (bits - 1) - 1)).clamp_min_(_TINY)
        torch.div(values, scale, out=out).round_().mul_(scale)
        return
    low = values.amin(reduce_dim, keepdim=True)
    scale = ((values.amax(reduce_dim, keepdim=True) - low) / (2**bits - 1)).clamp_min_(_TINY)
    torch.sub(values, low, out=out).div_(scale).round_().mul_(scale).add_(low)


def saturated(x: torch.Tensor, quantizer: Quantizer, layer: int | None = None) -> int:
    """How many elements of ``x`` ``(KV, n, D)`` (of ``layer``) a quantizer with static scales clips: ``|x| >
    scale · max(format)``; 0 for any other quantizer (a dynamic scale reaches its group's largest value)."""
    if quantizer.scales is None or x.numel() == 0:
        return 0
    scale = quantizer.static_scale(x.shape[0], layer, x.device)
    return int((x.float().abs() > scale * torch.finfo(quantizer.fp8).max).sum())


def layer_scale_bytes(quantizer: Quantizer) -> int:
    """Bytes of the one scale (and zero point) a ``tensor`` quantizer keeps per layer; NVFP4's float32 tensor scale."""
    if quantizer.fp4:
        return FP8_SCALE_BYTES if quantizer.per_layer else 0
    return quantizer.params * quantizer.scale_bytes


def packed_bytes(slots: int, bits: int, head_dim: int, quantizer: Quantizer, native_bytes: int) -> int:
    """Bytes of ``slots`` slots of one KV head stored at ``bits``: packed codes plus fp16 scales (and zero points).

    16 bits means untouched (``native_bytes`` per element, the model's dtype). Per-channel parameters are shared by
    the slots quantized together, so they are counted once per channel.
    """
    if slots == 0:
        return 0
    if bits == 16:
        return slots * head_dim * native_bytes
    if quantizer.outliers:  # the outlier channels at the model's dtype, one byte naming each, the rest rounded
        kept = quantizer.outliers
        return slots * kept * native_bytes + kept + packed_bytes(slots, bits, head_dim - kept, quantizer.plain,
                                                                 native_bytes)
    codes = -(-slots * head_dim * bits // 8)  # bit-packed, rounded up to whole bytes
    blocks = 1 if quantizer.block is None else -(-slots // quantizer.block)
    if quantizer.axis == "channel":
        groups = head_dim * blocks
    elif quantizer.axis == "head":
        groups = blocks
    elif quantizer.axis == "tensor":  # one scale per layer, shared by its KV heads: counted by layer_scale_bytes
        groups = 0
    else:
        groups = slots * quantizer.groups_per_slot(head_dim)
    return codes + groups * quantizer.params * quantizer.scale_bytes
