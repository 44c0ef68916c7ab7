"""Quantization schemes by name — the caches people deploy, as one :class:`Edit` at a step (docs/math.md §4).

A scheme says how every slot before the step is stored; names are what ``quant-compare``, ``whatif --scheme`` and
the app's comparison take:

- ``fp16`` — nothing quantized (the identity: KL exactly 0).
- ``int{8,4,3,2}-token`` — keys and values per token (one scale and zero point per slot and KV head).
- ``int{8,4,3,2}-channel`` — KIVI's granularity without its window: keys per channel, values per token.
- ``kivi-{4,2}`` — KIVI as a run holds the cache at that step (kvviz.schemes.kivi, G = 32, R = 128): whole groups of
  32 slots older than the newest 128 quantized, keys per channel within their group, values per token.
- ``fp8-{e4m3,e5m2}-{head,tensor}`` — an FP8 cache (vLLM's ``kv_cache_dtype``), one dynamic scale per KV head or
  per layer.
- ``fp8-{e4m3,e5m2}-{head,tensor}-static`` — the same with static scales calibrated on a calibration text
  (kvviz.schemes.calibration: vLLM's checkpoint ``k_scale`` / ``v_scale``); ``fp8-{e4m3,e5m2}-unit`` (also spelled
  ``fp8-e4m3-tensor-unit`` / ``-head-unit``: all ones either way) — every scale 1.0, what
  vLLM uses when a checkpoint has none. Values past the scale's range saturate.
- ``hqq-{8,4,3,2}`` — transformers' ``QuantizedCache`` with the HQQ backend: a policy run's cache only (HQQ's rounding
  is an optimisation the hqq package runs; kvviz.schemes.quanto).
- ``mix{B}-{uniform,keyerror}`` — mixed precision: every slot quantized at the width its layer and KV head get from a
  budget of ``B`` bits per pair on average (kvviz.quant.allocation: the same everywhere, or more where the keys lose
  most), keys per channel, values per token.
- ``quanto-{4,2}`` — transformers' ``QuantizedCache`` (quanto, ``q_group_size`` 64, ``residual_length`` 128) as it
  would hold this chat at that step: the passes of the growth log replayed through its flush rule, the slots of the
  last flush quantized per token in groups of 64 channels, the residual after it at full precision. It rounds each
  slot once; QuantizedCache rounds again at every later flush (float32 ulps of a dequantized value) — a policy run
  with ``--scheme quanto-N`` reproduces those flushes exactly (kvviz.schemes.quanto).

- ``nvfp4``, ``nvfp4-4over6``, ``mxfp4``, ``mxfp4-b16`` — 4-bit floats (E2M1) in blocks of channels of one slot and
  KV head (kvviz.quant.fp4): NVFP4 (blocks of 16, E4M3 block scales under a float32 scale per layer — dynamic: the
  amax of the slots quantized together — vLLM ``nvfp4`` / ``nvfp4_4over6``, TensorRT-LLM), MXFP4 (blocks of 32, E8M0
  scales, OCP) and SGLang's ``fp4_e2m1`` (MXFP4's scales in blocks of 16).
- ``{int8,int4,int2,fp8}-token-head`` — vLLM's ``int8_per_token_head`` / ``int4_per_token_head`` /
  ``fp8_per_token_head``: one float32 scale per slot and KV head, symmetric, computed when the slot is written;
  ``k{8,4,2}v{8,4,2}-token-head`` the same int codes with keys and values at different widths (e.g. ``k8v4``).

- ``fp8-ds-mla`` — a latent cache (multi-head latent attention, DeepSeek) as vLLM's ``fp8_ds_mla`` / FlashMLA's
  sparse FP8 layout stores it: each token's latent in E4M3, tiles of 128 channels with a power-of-two scale each
  (``e4m3-ue8m0``), its RoPE key untouched (16-bit in the engine: the model's own dtype). Latent models only; also a
  policy run's cache, each token rounded when written.

Those, the ``int`` and the ``fp8`` schemes take ``+skip-…`` rules: layers left at 16 bits (vLLM's
``--kv-cache-dtype-skip-layers``) — ``+skip-sliding`` (the sliding-window layers), ``+skip-firstN``, ``+skip-lastN``,
``+skip-3,7`` (a list); several rules add up, e.g. ``nvfp4+skip-sliding+skip-first1``.

The ``int`` and ``fp8`` schemes take ``+prerope`` (keys rounded before RoPE and rotated back, KVQuant) and outlier
handling as a suffix, for keys and values alike: ``+hadamard`` rounds
each slot's head vector in the basis of a normalised Hadamard matrix and rotates it back (QuaRot), ``+outliersK``
keeps the K channels with the largest magnitude per KV head exact and rounds the rest without them (KVQuant's
dense-and-sparse split, per channel), e.g. ``int2-token+outliers4``, ``int4-token+hadamard``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvviz.schemes.calibration import Calibration
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer
from kvviz.schemes.kivi import Kivi
from kvviz.schemes.quanto import QuantoCache
from kvviz.quant.names import PATTERNS, SKIP, check_names, scheme_family

DS_MLA_TILE = 128  # fp8_ds_mla: latent channels per scale (FlashMLA's tile_size)
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
    def skips(self) -> tuple[str, ...]:
        """Its ``+skip-…`` rules (layers kept at 16 bits)."""
        return tuple(s for s in self.name.split("+")[1:] if s.startswith("skip"))

    def exact_layers(self, windows: Sequence[int | None]) -> tuple[int, ...]:
        """The layers its ``+skip`` rules keep at 16 bits in a model whose layers have these sliding ``windows``
        (one per layer, None: full attention); a rule that names no layer of it, or rules that leave no layer
        quantized, are refused in one line."""
        layers, exact = len(windows), set()
        for rule in self.skips:
            first, last, listed = SKIP.fullmatch(rule).groups()
            if first or last:
                chosen = range(int(first)) if first else range(layers - int(last), layers)
            elif listed:
                chosen = [int(layer) for layer in listed.split(",")]
                if max(chosen) >= layers:
                    raise KvvizError(f"{self.name}: layer {max(chosen)} does not exist (the model has {layers})")
            else:
                chosen = [layer for layer, window in enumerate(windows) if window is not None]
                if not chosen:
                    raise KvvizError(f"{self.name}: this model has no sliding-window layer, so +skip-sliding names no "
                                     "layer")
            exact.update(chosen)
        if layers and len(exact) >= layers:
            raise KvvizError(f"{self.name} keeps all {layers} layers at 16 bits: nothing would be quantized")
        return tuple(sorted(exact))

    @property
    def label(self) -> str:
        suffix = self.outlier_settings
        extra = (", rounded after a Hadamard rotation" if "rotation" in suffix else
                 f", the {suffix['outliers']} largest channels per KV head exact" if suffix else "")
        skips = f", layers kept in 16 bits: {' '.join(rule[5:] for rule in self.skips)}" if self.skips else ""
        return self._base_label + extra + (", keys rounded before RoPE" if self.pre_rope else "") + skips

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
        if family == "fp4":
            return {"nvfp4": "NVFP4: E2M1 in blocks of 16, E4M3 block scales, a float32 scale per layer",
                    "nvfp4-4over6": "NVFP4, each block's scale for a largest value of 6 or 4, whichever errs less",
                    "mxfp4": "MXFP4: E2M1 in blocks of 32, power-of-two (E8M0) block scales",
                    "mxfp4-b16": "MXFP4 in blocks of 16 (SGLang's fp4_e2m1)"}[self.base]
        if family == "tokenhead":
            keys, values = self.token_head_widths
            kind = "FP8 E4M3" if self.base.startswith("fp8") else (
                f"int{keys}" if keys == values else f"int, keys {keys} bits, values {values} bits")
            return f"{kind}, one float32 scale per slot and KV head"
        if family == "dsmla":
            return "FP8 E4M3 latent in tiles of 128 with power-of-two scales, RoPE key untouched (vLLM's fp8_ds_mla)"
        if family == "fp8static":
            return (f"FP8 {parts[1]}, every scale 1.0 (vLLM without calibrated scales)" if parts[-1] == "unit" else
                    f"FP8 {parts[1]}, one static scale per {'KV head' if parts[2] == 'head' else 'layer'}, calibrated")
        return QuantoCache(int(parts[1]), backend=family).label

    @property
    def nominal_bits(self) -> float:
        """Bits per element its quantized slots nominally take, keys and values averaged, scales not counted (what the
        format's name promises: 4 for NVFP4, 6 for K8V4)."""
        family, width = self.family, self.base.split("-")[0]
        if family == "fp16":
            return 16.0
        if family == "tokenhead":
            return sum(self.token_head_widths) / 2
        if family == "mix":
            return self.mix[0]
        if family in ("fp8", "fp8static", "dsmla"):  # dsmla: the latent's 8 bits (its RoPE key is untouched)
            return 8.0
        if family == "fp4":
            return 4.0
        return float(width[3:] if family == "int" else self.base.rpartition("-")[2])  # kivi, quanto, hqq

    @property
    def token_head_widths(self) -> tuple[int, int]:
        """A ``…-token-head`` scheme's key and value widths."""
        width, keys, values = PATTERNS["tokenhead"].fullmatch(self.base).groups()
        if width:
            return (8, 8) if width == "fp8" else (int(width[3:]), int(width[3:]))
        return int(keys), int(values)

    def edit(self, passes: Sequence[int], at: int, calibration: Calibration | None = None,
             rope: tuple[float, ...] | None = None, head_widths: tuple[tuple[int, ...], ...] | None = None,
             windows: Sequence[int | None] | None = None, no_rope: tuple[int, ...] = ()) -> Edit:
        """The Edit of this scheme before the step of slot ``at``; ``passes`` are the slots each forward pass added
        (the transcript's growth log, for ``quanto``'s flushes); ``calibration`` gives a static scheme its scales,
        ``rope`` (the model's RoPE frequencies, kvviz.rope.rope_frequencies) and ``no_rope`` (its layers without
        RoPE, kvviz.rope.no_rope_layers) a ``+prerope`` one its keys',
        ``head_widths`` a ``mix`` one its widths (kvviz.quant.allocation), ``windows`` (each layer's sliding window,
        None: full attention) a ``+skip`` one its layers. :func:`kvviz.schemes.compare.scheme_edits` supplies
        them from a session."""
        edit = self._edit(passes, at, calibration, rope, head_widths, no_rope)
        if self.skips:
            if windows is None:
                raise KvvizError(f"{self.name} needs the model's layers (their sliding windows) for its +skip rules")
            edit = replace(edit, exact_layers=self.exact_layers(windows))
        return edit

    def _edit(self, passes: Sequence[int], at: int, calibration: Calibration | None,
              rope: tuple[float, ...] | None, head_widths: tuple[tuple[int, ...], ...] | None,
              no_rope: tuple[int, ...] = ()) -> Edit:
        family, parts, extra = self.family, self.base.split("-"), self.outlier_settings
        if self.pre_rope and rope is None:
            raise KvvizError(f"{self.name} needs the model's RoPE frequencies to round keys before RoPE")
        key_extra = extra | ({"rope": rope, "no_rope": no_rope} if self.pre_rope else {})
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
        if family == "fp4":
            block = 16 if self.base == "mxfp4-b16" else None  # SGLang's blocks of 16; else the format's own
            quantizer = Quantizer("token", block, format=self.base.removesuffix("-b16"))
            return Edit.quantize(slots, 4, keys=quantizer, values=quantizer)
        if family == "tokenhead":
            quantizer = (Quantizer("token", format="e4m3") if self.base.startswith("fp8") else
                         Quantizer("token", symmetric=True, fp32_scales=True))
            return Edit.quantize(slots, *self.token_head_widths, keys=quantizer, values=quantizer)
        if family == "dsmla":
            return Edit.quantize(slots, 8, 16, keys=Quantizer("token", DS_MLA_TILE, format="e4m3-ue8m0"),
                                 values=Quantizer("token"))
        if family == "fp8static":
            if calibration is None:
                raise KvvizError(f"{self.name} needs a calibration (kvviz.schemes.calibration.calibrate) for its scales")
            keys, values = calibration.quantizers(parts[1], "unit" if parts[-1] == "unit" else parts[2])
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
