"""A scheme as a run's cache (:func:`run_cache`): KIVI's, QuantizedCache's, or — :class:`WrittenCache` — as the
engines keep theirs: each slot quantized once, when it is written, never again.

vLLM, SGLang and TensorRT-LLM quantize a token's K/V as they write it to the cache (``reshape_and_cache``), with the
format's scales: per slot (int per token, FP4 blocks, per token and KV head) or fixed beforehand (static FP8 scales,
1.0). A scale that would span slots — FP8's dynamic one per KV head or per layer, NVFP4's tensor scale — is fixed at
the first pass from the K/V it wrote (the prompt's) and kept for every later slot, as vLLM's
``--calculate-kv-scales`` does; a later value past that range saturates. Layers kept exact by a ``+skip`` rule stay
as computed.

kvviz runs it like KIVI without a window (kvviz.runs.timeline): before each step the slots written since the last
one are rounded in place, their originals kept. By default the step's own K/V attend at full precision in the pass
that computed them, so that a run's step equals the what-if of the same scheme on the same cache. With ``own``
(the engines' order: write, then attend) every pass after the first rounds its new K/V as the cache writes them and
attends to them rounded — a second turn's prompt too; the first pass attends to the fresh K/V. ``quantized-fp8`` is
transformers' ``QuantizedCache(backend="fp8")`` (``cache_utils.Fp8QuantizedLayer``): ``fp8-e4m3-tensor`` with its
per-layer scale ``amax / 448`` frozen at the first update, ``own`` (checked step by step against transformers).
Schemes whose scales span the slots quantized together are refused: per channel (``int*-channel``, ``mix``: the run
form of per-channel keys is ``kivi-N``), outlier channels (chosen over the slots).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.schemes.cache_format import CacheFormat
from kvviz.schemes.calibration import CALIBRATION_TEXT, calibrate
from kvviz.schemes.catalogue import Scheme
from kvviz.quant.fp4 import E2M1_MAX, E4M3_MAX
from kvviz.schemes.kivi import Kivi
from kvviz.quant.names import WRITTEN_FAMILIES, run_family
from kvviz.schemes.quanto import QuantoCache
from kvviz.quant.quantizer import Quantizer
from kvviz.rope import no_rope_layers, rope_frequencies

_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class WrittenCache(CacheFormat):
    """Scheme ``scheme`` (kvviz.schemes.catalogue) as a run's cache format. :meth:`for_model` resolves what it needs
    from the model (its quantizers, widths and layers kept exact); :meth:`fixed` its first-pass scales. Every slot
    written before a step is rounded (:meth:`quantized_prefix`, :meth:`edit`); with ``own``, :meth:`rounded` — how a
    pass stores (and attends to) its new K/V."""

    kind: ClassVar[str] = "written"
    scheme: str
    own: bool = False  # the passes after the first attend to their own K/V rounded (the engines', transformers' fp8)
    template: Edit | None = field(default=None, compare=False)  # the scheme's quantization of one slot, resolved
    grouping: str = "blocks"  # each write rounded on its own, never again (kvviz.runs.timeline)

    def __post_init__(self) -> None:
        if run_family(self.scheme) not in WRITTEN_FAMILIES:
            raise KvvizError(f"{self.scheme} is a run cache of its own (kivi-N, quanto-N, hqq-N), not written slot by "
                             "slot")

    def for_model(self, lm) -> WrittenCache:
        """This cache with the scheme's quantizers for ``lm`` (RoPE frequencies, calibrated static scales, the layers
        its ``+skip`` rules keep exact)."""
        scheme = Scheme(self.scheme)
        if scheme.family == "dsmla" and lm.attention.latent is None:
            raise KvvizError(f"{self.scheme} stores a latent cache (multi-head latent attention, DeepSeek); this model "
                             "caches keys and values per KV head")
        calibration = calibrate(lm, CALIBRATION_TEXT) if scheme.static else None
        rope = rope_frequencies(lm) if scheme.pre_rope else None
        windows = lm.attention.windows or (None,) * lm.layers
        template = scheme.edit([1], 1, calibration, rope, None, windows, no_rope_layers(lm))
        for quantizer, width in zip((template.keys, template.values), lm.geometry.cached_widths):
            quantizer.check_model(lm.layers, lm.kv_heads, width)
        return replace(self, template=template)

    @property
    def first_pass(self) -> bool:
        """Whether a scale spans slots and is fixed from the first pass (dynamic FP8 per KV head or layer, NVFP4)."""
        return any(_spans(q) for q in (self._template.keys, self._template.values))

    def fixed(self, keys: torch.Tensor, values: torch.Tensor) -> WrittenCache:
        """This cache with the scales that span slots fixed from the first pass's K/V (each ``(L, KV, n, D)``); the
        others as they are."""
        template = self._template
        settings = {"keys": _fixed(template.keys, keys), "values": _fixed(template.values, values)}
        return replace(self, template=replace(template, **settings))

    @property
    def _template(self) -> Edit:
        if self.template is None:
            raise ValueError("a written cache needs its model first: WrittenCache.for_model(lm)")
        return self.template

    def after_first_pass(self, keys: torch.Tensor, values: torch.Tensor) -> WrittenCache:
        return self.fixed(keys, values) if self.first_pass else self

    def quantized_prefix(self, cached: int) -> int:
        """Every slot written before the step is rounded."""
        return cached

    def edit(self, slots: range) -> Edit:
        """The rounding of ``slots`` as an :class:`Edit` (each slot on its own scales, or the fixed ones; a kind the
        scheme leaves at 16 bits, as fp8-ds-mla its RoPE keys, untouched)."""
        template = self._template
        widths = [bits.get(0) for bits in (template.key_bits, template.value_bits)]
        key_bits, value_bits = ({} if width is None else dict.fromkeys(slots, width) for width in widths)
        return replace(template, key_bits=key_bits, value_bits=value_bits)

    def rounded(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New keys and values ``(B, KV, q, D)`` of ``layer`` as the cache writes them (new tensors)."""
        edit = self.edit(range(keys.shape[2]))
        pairs = [edit.quantized(k, v, layer) for k, v in zip(keys, values)]
        return torch.stack([k for k, _ in pairs]), torch.stack([v for _, v in pairs])

    def settings(self) -> dict:
        return {"scheme": self.scheme, "own": self.own}

    @property
    def name(self) -> str:
        """Its name in a run's words: the scheme, or ``quantized-fp8``."""
        return "quantized-fp8" if self == QUANTIZED_FP8 else self.scheme + (" (own K/V rounded)" if self.own else "")

    @property
    def label(self) -> str:
        scheme = Scheme(self.scheme)
        if self == QUANTIZED_FP8:
            return ("transformers' QuantizedCache (fp8): FP8 e4m3, one scale per layer frozen at the first pass, "
                    "each slot rounded when written, the step's own K/V too")
        fixed = scheme.family == "fp8" or scheme.base.startswith("nvfp4")  # dynamic scales that span slots
        parts = [scheme.label, "each slot rounded when written"] + ["scales fixed by the first pass"] * fixed + [
            "the step's own K/V too"] * self.own
        return ", ".join(parts)


def _spans(quantizer: Quantizer) -> bool:
    return quantizer.scales is None and (quantizer.axis in ("head", "tensor") and quantizer.fp8 is not None
                                         or quantizer.format.startswith("nvfp4"))


def _fixed(quantizer: Quantizer, x: torch.Tensor) -> Quantizer:
    """``quantizer`` with static scales from ``x`` ``(L, KV, n, D)`` if its dynamic scale spans slots: FP8's
    ``amax / max(format)`` per KV head or per layer, NVFP4's tensor scale ``amax / (448 · 6)`` per layer."""
    if not _spans(quantizer):
        return quantizer
    amax = x.detach().float().abs().amax((2, 3))  # (L, KV)
    if quantizer.axis == "tensor" or quantizer.fp4:
        amax = amax.amax(1, keepdim=True).expand_as(amax)
    top = E4M3_MAX * E2M1_MAX if quantizer.fp4 else torch.finfo(quantizer.fp8).max
    return replace(quantizer, scales=(amax / top).clamp(min=_TINY).tolist())


QUANTIZED_FP8 = WrittenCache("fp8-e4m3-tensor", own=True)  # transformers' QuantizedCache(backend="fp8")


def run_cache(name: str, q_group_size: int = 64, residual: int = 128, axis: int = 0,
              own: bool = False) -> CacheFormat | None:
    """The cache format a policy run keeps for scheme ``name`` (``RunSettings.cache_format``): :class:`Kivi`
    (``kivi-N``), :class:`QuantoCache` (``quanto-N``, ``hqq-N``; ``axis``: QuantizedCache's, for keys and values) or a
    :class:`WrittenCache` (the per-slot schemes, each slot rounded when written — with ``own`` the step's own K/V too;
    ``quantized-fp8``: transformers' fp8 QuantizedCache); None for ``fp16``, the model's own cache. Per-channel and
    mixed schemes are refused in one line (their scales span the slots)."""
    family, bits = run_family(name), name.rpartition("-")[2]
    if family == "fp16":
        return None
    if family == "quantized":
        return QUANTIZED_FP8
    if family == "kivi":
        return Kivi(int(bits), int(bits))
    if family in ("quanto", "hqq"):
        return QuantoCache(int(bits), q_group_size, residual, axis, axis, backend=family)
    return WrittenCache(name, own)
