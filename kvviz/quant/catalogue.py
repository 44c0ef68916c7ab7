"""Quantization schemes by name — the caches people deploy, as one :class:`Edit` at a step (docs/math.md §4).

A scheme says how every slot before the step is stored; names are what ``quant-compare``, ``whatif --scheme`` and
the app's comparison take:

- ``fp16`` — nothing quantized (the identity: KL exactly 0).
- ``int{8,4,3,2}-token`` — keys and values per token (one scale and zero point per slot and KV head).
- ``int{8,4,3,2}-channel`` — KIVI's granularity without its window: keys per channel, values per token.
- ``kivi-{4,2}`` — KIVI as a run holds the cache at that step (kvviz.quant.kivi, G = 32, R = 128): whole groups of
  32 slots older than the newest 128 quantized, keys per channel within their group, values per token.
- ``fp8-{e4m3,e5m2}-{head,tensor}`` — an FP8 cache (vLLM's ``kv_cache_dtype``), one dynamic scale per KV head or
  per layer.
- ``fp8-{e4m3,e5m2}-{head,tensor}-static`` — the same with static scales calibrated on a calibration text
  (kvviz.quant.calibration: vLLM's checkpoint ``k_scale`` / ``v_scale``); ``fp8-{e4m3,e5m2}-unit`` — every scale 1.0, what
  vLLM uses when a checkpoint has none. Values past the scale's range saturate.
- ``hqq-{8,4,3,2}`` — transformers' ``QuantizedCache`` with the HQQ backend: a policy run's cache only (HQQ's rounding
  is an optimisation the hqq package runs; kvviz.quant.quanto).
- ``mix{B}-{uniform,keyerror}`` — mixed precision: every slot quantized at the width its layer and KV head get from a
  budget of ``B`` bits per pair on average (kvviz.quant.allocation: the same everywhere, or more where the keys lose
  most), keys per channel, values per token.
- ``quanto-{4,2}`` — transformers' ``QuantizedCache`` (quanto, ``q_group_size`` 64, ``residual_length`` 128) as it
  would hold this chat at that step: the passes of the growth log replayed through its flush rule, the slots of the
  last flush quantized per token in groups of 64 channels, the residual after it at full precision. It rounds each
  slot once; QuantizedCache rounds again at every later flush (float32 ulps of a dequantized value) — a policy run
  with ``--scheme quanto-N`` reproduces those flushes exactly (kvviz.quant.quanto).

The ``int`` and ``fp8`` schemes take ``+prerope`` (keys rounded before RoPE and rotated back, KVQuant) and outlier
handling as a suffix, for keys and values alike: ``+hadamard`` rounds
each slot's head vector in the basis of a normalised Hadamard matrix and rotates it back (QuaRot), ``+outliersK``
keeps the K channels with the largest magnitude per KV head exact and rounds the rest without them (KVQuant's
dense-and-sparse split, per channel), e.g. ``int2-token+outliers4``, ``int4-token+hadamard``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.quant.calibration import Calibration
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer
from kvviz.quant.kivi import Kivi
from kvviz.quant.quanto import QuantoCache
from kvviz.quant.names import PATTERNS, check_names, run_family, scheme_family

MIX_KEYS = Quantizer("channel")  # the mix schemes' keys: how they are stored, and what the allocation measures


@dataclass(frozen=True)
class Scheme:
    """One named scheme; :meth:`edit` gives its :class:`Edit` before the step of a slot."""

    name: str

    def __post_init__(self) -> None:
        scheme_family(self.name)  # refuses any other name in one line

    @property
    def base(self) -> str:
        return self.name.partition("+")[0]

    @property
    def family(self) -> str:
        return scheme_family(self.name)

    @property
    def static(self) -> bool:
        """Whether its scales are static: calibrated (``…-static``) or 1.0 (``…-unit``)."""
        return self.family == "fp8static"

    @property
    def mix(self) -> tuple[float, str]:
        """A ``mix`` scheme's average width and allocation rule."""
        average, rule = PATTERNS["mix"].fullmatch(self.base).groups()
        return float(average), rule

    @property
    def pre_rope(self) -> bool:
        """Whether its keys are rounded before RoPE (``+prerope``, KVQuant)."""
        return "prerope" in self.name.split("+")[1:]

    @property
    def outlier_settings(self) -> dict:
        """The quantizer fields of the suffixes other than ``+prerope``: ``rotation`` or ``outliers``."""
        for suffix in self.name.split("+")[1:]:
            if suffix == "hadamard":
                return {"rotation": "hadamard"}
            if suffix.startswith("outliers"):
                return {"outliers": int(suffix[len("outliers"):])}
        return {}

    @property
    def label(self) -> str:
        suffix = self.outlier_settings
        extra = (", rounded after a Hadamard rotation" if "rotation" in suffix else
                 f", the {suffix['outliers']} largest channels per KV head exact" if suffix else "")
        return self._base_label + extra + (", keys rounded before RoPE" if self.pre_rope else "")

    @property
    def _base_label(self) -> str:
        family, parts = self.family, self.base.split("-")
        if family == "fp16":
            return "16 bits (nothing quantized)"
        if family == "int":
            bits, axis = parts[0][3:], parts[1]
            return f"int{bits}, keys per {axis}, values per token"
        if family == "kivi":
            return Kivi(int(parts[1]), int(parts[1])).label
        if family == "fp8":
            return f"FP8 {parts[1]}, one dynamic scale per {'KV head' if parts[2] == 'head' else 'layer'}"
        if family == "mix":
            average, rule = self.mix
            return (f"mixed precision, {average:g} bits per layer and KV head on average, "
                    f"{'the same everywhere' if rule == 'uniform' else 'more where the keys lose most'}; keys per "
                    "channel, values per token")
        if family == "fp8static":
            return (f"FP8 {parts[1]}, every scale 1.0 (vLLM without calibrated scales)" if parts[2] == "unit" else
                    f"FP8 {parts[1]}, one static scale per {'KV head' if parts[2] == 'head' else 'layer'}, calibrated")
        return QuantoCache(int(parts[1]), backend=family).label

    def edit(self, passes: Sequence[int], at: int, calibration: Calibration | None = None,
             rope: tuple[float, ...] | None = None, head_widths: tuple[tuple[int, ...], ...] | None = None) -> Edit:
        """The Edit of this scheme before the step of slot ``at``; ``passes`` are the slots each forward pass added
        (the transcript's growth log, for ``quanto``'s flushes); ``calibration`` gives a static scheme its scales,
        ``rope`` (the model's RoPE frequencies, kvviz.rope.rope_frequencies) a ``+prerope`` one its keys',
        ``head_widths`` a ``mix`` one its widths (kvviz.quant.allocation). :func:`kvviz.whatif.compare_schemes.scheme_edits`
        supplies all three from a session."""
        family, parts, extra = self.family, self.base.split("-"), self.outlier_settings
        if self.pre_rope and rope is None:
            raise KvvizError(f"{self.name} needs the model's RoPE frequencies to round keys before RoPE")
        key_extra = extra | ({"rope": rope} if self.pre_rope else {})
        slots = range(at)
        if family == "fp16":
            return Edit()
        if family == "int":
            bits = int(parts[0][3:])
            return Edit.quantize(slots, bits, keys=Quantizer(parts[1], **key_extra), values=Quantizer("token", **extra))
        if family == "kivi":
            kivi = Kivi(int(parts[1]), int(parts[1]))
            return kivi.edit(range(kivi.quantized_prefix(at)))
        if family == "fp8":
            return Edit.quantize(slots, 8, keys=Quantizer(parts[2], format=parts[1], **key_extra),
                                 values=Quantizer(parts[2], format=parts[1], **extra))
        if family == "fp8static":
            if calibration is None:
                raise KvvizError(f"{self.name} needs a calibration (kvviz.quant.calibration.calibrate) for its scales")
            keys, values = calibration.quantizers(parts[1], parts[2])
            return Edit.quantize(slots, 8, keys=keys, values=values)
        if family == "mix":
            if head_widths is None:
                raise KvvizError(f"{self.name} needs its widths per layer and KV head (kvviz.quant.allocation.allocate)")
            return Edit.quantize(slots, 2, keys=MIX_KEYS, values=Quantizer("token"), head_widths=head_widths)
        if family == "hqq":
            raise KvvizError(f"{self.name} is transformers' QuantizedCache with the HQQ backend, whose rounding is an "
                             "optimisation the hqq package runs: a policy run's cache (policy-run --scheme "
                             f"{self.name}), not a what-if")
        quanto = QuantoCache(int(parts[1]))
        return Edit.quantize(range(quanto_prefix(passes, at, quanto.residual_length)), quanto.nbits,
                             keys=quanto.quantizer, values=quanto.quantizer)


def run_cache(name: str, q_group_size: int = 64, residual: int = 128, axis: int = 0
              ) -> tuple[Kivi | None, QuantoCache | None]:
    """The cache a policy run keeps for scheme ``name`` (``kivi``, ``kivi-N``, ``quanto-N`` and ``hqq-N``: quantized
    as the run goes): its ``(kivi, quanto)`` settings (``axis``: QuantizedCache's, for keys and values); ``fp16`` is
    the model's own cache. Other schemes are what-if only."""
    family, bits = run_family(name), name.rpartition("-")[2]
    if family == "fp16":
        return None, None
    if family == "kivi":
        return Kivi(int(bits), int(bits)), None
    if family == "quanto":
        return None, QuantoCache(int(bits), q_group_size, residual, axis, axis)
    return None, QuantoCache(int(bits), q_group_size, residual, axis, axis, backend="hqq")  # hqq


def quanto_prefix(passes: Sequence[int], at: int, residual_length: int) -> int:
    """How many leading slots QuantizedCache holds quantized before the step of slot ``at``: the passes (slots
    added by each) that end by ``at`` replayed through its rule — the first pass is quantized at once, a later one
    joins the residual unless that would reach ``residual_length``, then everything is quantized again."""
    end, residual, prefix = 0, None, 0
    for added in passes:
        if end + added > at:
            break
        end += added
        if residual is not None and residual + added < residual_length:
            residual += added
        else:
            residual, prefix = 0, end
    return prefix


def schemes(names: Sequence[str]) -> list[Scheme]:
    """The schemes of ``names``, each checked; refuses an empty list and repeats."""
    check_names(names)
    return [Scheme(name) for name in names]
