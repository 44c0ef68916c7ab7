"""transformers' ``QuantizedCache`` with the quanto backend, as a policy run's cache (docs/math.md §9).

transformers (5.x, ``cache_utils.QuantizedLayer``) keeps a quantized part and a full-precision residual: the prompt's
K/V are quantized as soon as it is prefilled (its own pass attends to them unquantized); each decode step appends
its K/V to the residual; the step at which the residual would reach ``residual_length`` still attends to it
unquantized, then everything — the quantized part dequantized, the residual, the new slot — is quantized again
together (values already quantized are rounded a second time). quanto's axis-0 quantization (``MaxOptimizer``,
``quantize_weight``, ``dequantize``) is an asymmetric min/max quantizer over groups of ``q_group_size`` consecutive
channels of one slot and KV head: kvviz's per-token quantizer with that group size, the same floating-point
operations (tested bit for bit against optimum-quanto).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.quant import Quantizer, fake_quantize


@dataclass(frozen=True)
class QuantoCache:
    nbits: int = 4  # 2 or 4 (quanto's qint2 / qint4)
    q_group_size: int = 64  # channels per scale and zero point
    residual_length: int = 128  # full-precision slots gathered before they are quantized
    axis_key: int = 0  # quanto's axis 0 (groups of channels per slot); axis -1 is not reproduced
    axis_value: int = 0

    def __post_init__(self) -> None:
        if self.nbits not in (2, 4):
            raise KvvizError(f"QuantizedCache's quanto backend takes nbits 2 or 4, got {self.nbits!r}")
        for name in ("q_group_size", "residual_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvvizError(f"QuantizedCache's {name} must be a positive integer, got {value!r}")
        if self.axis_key != 0 or self.axis_value != 0:
            raise KvvizError("kvviz reproduces QuantizedCache with axis_key=0 and axis_value=0 (groups of channels per "
                             "slot); quanto's axis -1 groups slots across KV heads")

    @property
    def quantizer(self) -> Quantizer:
        return Quantizer("token", self.q_group_size)

    @property
    def label(self) -> str:
        return (f"QuantizedCache (quanto) {self.nbits} bits, groups of {self.q_group_size} channels, residual "
                f"{self.residual_length}")

    def settings(self) -> dict:
        return asdict(self)

    def check(self, head_dim: int) -> None:
        self.quantizer.check(head_dim)

    def flushed(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, n, D)`` as one flush leaves them: all of them quantized together."""
        return fake_quantize(keys, self.nbits, self.quantizer), fake_quantize(values, self.nbits, self.quantizer)
