"""KIVI as it runs — Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache" (ICML 2024).

The most recent ``residual`` slots stay at full precision; as each group of ``group`` slots (counted from slot 0) is
entirely older than that, it is quantized once: its keys per channel within the group (one scale and zero point per
KV head, channel and group), its values per token. ``grouping="shared"`` is the simpler quantizer kvviz's what-if uses
elsewhere: one scale per channel across all quantized slots, so every new group re-quantizes the older ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar, Literal

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, check_bits
from kvviz.schemes.cache_format import CacheFormat


@dataclass(frozen=True)
class Kivi(CacheFormat):
    """KIVI as a run's cache format (see the module doc)."""

    kind: ClassVar[str] = "kivi"
    key_bits: int = 2
    value_bits: int = 2
    group: int = 32  # slots per key group (the paper's G)
    residual: int = 128  # most recent slots kept at full precision (the paper's R)
    grouping: Literal["blocks", "shared"] = "blocks"

    def __post_init__(self) -> None:
        for bits in (self.key_bits, self.value_bits):
            if check_bits(bits) == 16:
                raise KvvizError("KIVI quantizes to fewer than 16 bits (8, 4, 3 or 2)")
        for name in ("group", "residual"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "group" else 0):
                raise KvvizError(f"KIVI's {name} must be a {'positive' if name == 'group' else 'non-negative'} "
                                 f"integer, got {value!r}")
        if self.grouping not in ("blocks", "shared"):
            raise KvvizError(f"KIVI's grouping must be 'blocks' or 'shared', got {self.grouping!r}")

    def quantized_prefix(self, cached: int) -> int:
        """How many leading slots are quantized when ``cached`` slots are cached: whole groups older than the
        full-precision window."""
        return max(0, cached - self.residual) // self.group * self.group

    def edit(self, slots: range) -> Edit:
        """The quantization of ``slots`` as an :class:`Edit` (keys per channel in blocks of ``group``, or shared)."""
        keys = Quantizer(axis="channel", block=self.group if self.grouping == "blocks" else None)
        return Edit(key_bits=dict.fromkeys(slots, self.key_bits), value_bits=dict.fromkeys(slots, self.value_bits),
                    keys=keys, values=Quantizer(axis="token"))

    def settings(self) -> dict:
        return asdict(self)

    @property
    def window_bits(self) -> tuple[int, int]:
        return self.key_bits, self.value_bits

    @property
    def name(self) -> str:
        return f"KIVI K{self.key_bits}/V{self.value_bits}"

    @property
    def label(self) -> str:
        scale = f"keys per channel in groups of {self.group}" if self.grouping == "blocks" else \
            "keys per channel, one scale shared by all quantized slots"
        return (f"KIVI K{self.key_bits}/V{self.value_bits}: {scale}, values per token, "
                f"the last {self.residual} slots at 16 bits")
