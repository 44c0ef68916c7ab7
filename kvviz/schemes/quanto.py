"""transformers' ``QuantizedCache`` with the quanto or the HQQ backend, as a policy run's cache (docs/math.md §9).

transformers (5.x, ``cache_utils.QuantizedLayer``) keeps a quantized part and a full-precision residual: the prompt's
K/V are quantized as soon as it is prefilled (its own pass attends to them unquantized); each decode step appends
its K/V to the residual; the step at which the residual would reach ``residual_length`` still attends to it
unquantized, then everything — the quantized part dequantized, the residual, the new slot — is quantized again
together (values already quantized are rounded a second time). quanto's axis-0 quantization (``MaxOptimizer``,
``quantize_weight``, ``dequantize``) is an asymmetric min/max quantizer over groups of ``q_group_size`` consecutive
channels of one slot and KV head: kvviz's per-token quantizer with that group size, the same floating-point
operations (tested bit for bit against optimum-quanto); its axis -1 is optimum-quanto's own code, called as
transformers' ``QuantoQuantizedLayer`` calls it. HQQ (``hqq.core.quantize.Quantizer``: half-quadratic
optimisation of each group's zero point) is called as transformers' ``HQQQuantizedLayer`` calls it, on the same
``(1, KV, n, D)`` tensor: its axis 1 groups ``q_group_size`` channels of one slot, its axis 0 (transformers'
default) groups strided elements across slots and KV heads, so a flush's rounding depends on the whole flush.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, fake_quantize
from kvviz.schemes.cache_format import CacheFormat

BITS = {"quanto": (2, 4), "hqq": (1, 2, 3, 4, 8)}


@dataclass(frozen=True)
class QuantoCache(CacheFormat):
    """transformers' QuantizedCache as a run's cache format (see the module doc)."""

    kind: ClassVar[str] = "quanto"
    per_slot: ClassVar[bool] = False  # a flush rounds the whole prefix again together
    nbits: int = 4  # quanto: 2 or 4 (qint2 / qint4); HQQ: 1, 2, 3, 4 or 8
    q_group_size: int = 64  # channels (quanto, HQQ axis 1) or elements (HQQ axis 0) per scale and zero point
    residual_length: int = 128  # full-precision slots gathered before they are quantized
    axis_key: int = 0  # quanto: 0 (groups of channels per slot) or -1; HQQ: 0 or 1
    axis_value: int = 0
    backend: str = "quanto"  # or "hqq"

    def __post_init__(self) -> None:
        if self.backend not in BITS:
            raise KvvizError(f"QuantizedCache's backend is 'quanto' or 'hqq' here, got {self.backend!r}")
        if self.nbits not in BITS[self.backend]:
            raise KvvizError(f"QuantizedCache's {self.backend} backend takes nbits "
                             f"{', '.join(map(str, BITS[self.backend]))}, got {self.nbits!r}")
        for name in ("q_group_size", "residual_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvvizError(f"QuantizedCache's {name} must be a positive integer, got {value!r}")
        axes = (0, -1) if self.backend == "quanto" else (0, 1)
        if self.axis_key not in axes or self.axis_value not in axes:
            raise KvvizError("QuantizedCache takes axis_key and axis_value 0 or -1 with quanto, 0 or 1 with HQQ")

    @property
    def quantizer(self) -> Quantizer:
        """quanto's rounding as a kvviz quantizer (what-ifs of the ``quanto-N`` schemes); HQQ has none."""
        if self.backend != "quanto":
            raise KvvizError("HQQ's rounding is an optimisation run by the hqq package: it is a policy run's cache "
                             "(policy-run --scheme hqq-4), not a what-if scheme")
        return Quantizer("token", self.q_group_size)

    @property
    def label(self) -> str:
        axes = f", axes {self.axis_key}/{self.axis_value}" if self.backend == "hqq" else ""
        return (f"QuantizedCache ({self.backend}) {self.nbits} bits, groups of {self.q_group_size} "
                f"{'elements' if self.backend == 'hqq' and 0 in (self.axis_key, self.axis_value) else 'channels'}, "
                f"residual {self.residual_length}{axes}")

    def settings(self) -> dict:
        return asdict(self)

    @property
    def name(self) -> str:
        return f"QuantizedCache ({self.backend}) {self.nbits} bits"

    def for_model(self, lm) -> QuantoCache:
        self.check(lm.head_dim)
        return self

    def flush_due(self, residual: int | None, added: int) -> bool:
        """The first pass's K/V are quantized at once; later ones join the residual until it would reach
        ``residual_length``, then everything is quantized again together."""
        return residual is None or residual + added >= self.residual_length

    def check(self, head_dim: int) -> None:
        if self.backend == "quanto":
            if 0 in (self.axis_key, self.axis_value):  # axis 0: groups of channels, which must divide the head
                self.quantizer.check(head_dim)
            if -1 in (self.axis_key, self.axis_value):
                _optimum_quanto()
            return
        _hqq()
        if head_dim % self.q_group_size:
            raise KvvizError(f"group size {self.q_group_size} does not divide the head dimension {head_dim}")

    def flushed(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, n, D)`` as one flush leaves them: all of them quantized together."""
        if self.backend == "quanto":
            return self._quanto(keys, self.axis_key), self._quanto(values, self.axis_value)
        return self._hqq(keys, self.axis_key), self._hqq(values, self.axis_value)

    def _quanto(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        """quanto's round trip of ``x`` ``(KV, n, D)``: on axis 0 kvviz's own per-token quantizer (the same float32
        operations, tested bit for bit); on axis -1 optimum-quanto itself, called as ``QuantoQuantizedLayer`` calls
        it on the batch-1 tensor."""
        if axis == 0:
            return fake_quantize(x, self.nbits, self.quantizer)
        quanto = _optimum_quanto()
        whole, qtype = x.contiguous()[None], quanto.qint4 if self.nbits == 4 else quanto.qint2
        try:
            scale, shift = quanto.MaxOptimizer()(whole, qtype, axis, self.q_group_size)
            return quanto.quantize_weight(whole, qtype, axis, scale, shift, self.q_group_size).dequantize()[0]
        except (RuntimeError, ValueError) as exc:
            raise KvvizError(f"quanto cannot quantize a flush of {whole.shape[2]} slots on axis -1 in groups of "
                             f"{self.q_group_size} ({exc})".splitlines()[0]) from exc

    def _hqq(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        """HQQ's round trip of ``x`` ``(KV, n, D)`` exactly as ``HQQQuantizedLayer._quantize`` / ``_dequantize`` do
        it (on the batch-1 tensor, in the cache's dtype)."""
        quantizer = _hqq()
        whole = x.contiguous()[None]
        try:
            codes, meta = quantizer.quantize(whole, axis=axis, device=whole.device, compute_dtype=whole.dtype,
                                             nbits=self.nbits, group_size=self.q_group_size)
            meta["compute_dtype"] = whole.dtype
            quantizer.cuda(codes, meta=meta, device=whole.device)  # (its name) moves to the device, casts the dtype
            meta["scale"], meta["zero"] = meta["scale"].to(codes.device), meta["zero"].to(codes.device)
            return quantizer.dequantize(codes, meta)[0]
        except RuntimeError as exc:  # hqq packs 2 / 3 / 1-bit codes in rows of 4 / 10 / 8 groups
            raise KvvizError(f"hqq cannot pack {self.nbits}-bit codes of a flush of {whole.shape[2]} slots on axis "
                             f"{axis} ({whole.numel() // self.q_group_size} groups; transformers' HQQ cache fails the "
                             "same way): use axis 0 or 4 / 8 bits") from exc


def _optimum_quanto():
    """optimum.quanto, or a one-line refusal when the package is missing."""
    try:
        from optimum import quanto
    except ImportError:
        raise KvvizError("quanto's axis -1 needs the optimum-quanto package (pip install optimum-quanto==0.2.7)") from None
    return quanto


def _hqq():
    """hqq's Quantizer, or a one-line refusal when the package is missing."""
    try:
        from hqq.core.quantize import Quantizer as HQQQuantizer
    except ImportError:
        raise KvvizError("the HQQ backend needs the hqq package (pip install hqq==0.2.8)") from None
    return HQQQuantizer
