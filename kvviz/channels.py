"""The cache by channel (docs/math.md §4): how large each channel of one KV head's keys and values is over the slots,
before and after RoPE, which key channels are outliers, and the error each quantizer leaves in each key channel —
why keys are quantized per channel (KIVI's figure 1, on the model at hand).

An *outlier channel* is one whose largest magnitude over the slots is at least :data:`OUTLIER_FACTOR` times that of
the median channel of its KV head. Pre-RoPE keys are the cached (post-RoPE) keys rotated back by their positions
(RoPE is a rotation: kvviz.rope); a model without a plain RoPE has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, fake_quantize
from kvviz.session import Session

OUTLIER_FACTOR = 4.0
QUANTIZERS = {"per token": Quantizer("token"), "per channel": Quantizer("channel"),
              "per token, 4 outliers exact": Quantizer("token", outliers=4),
              "per token, Hadamard": Quantizer("token", rotation="hadamard")}
FP4_QUANTIZERS = {"NVFP4 (blocks of 16)": Quantizer("token", format="nvfp4"),  # at 4 bits only (kvviz.quant.fp4)
                  "MXFP4 (blocks of 32)": Quantizer("token", format="mxfp4")}


@dataclass(frozen=True)
class Channels:
    """One KV head of one layer over the slots before ``at``. Maps are ``(n, D)`` magnitudes; ``peaks`` ``(D,)`` the
    largest over the slots, ``means`` ``(D,)`` the mean magnitude; ``outliers`` the outlier key channels (pre-RoPE
    where there is RoPE); ``errors``: per quantizer at ``bits``, each key channel's RMS rounding error ``(D,)`` (at 4
    bits also NVFP4's and MXFP4's, whose blocks of consecutive channels show as steps)."""

    layer: int
    kv_head: int
    at: int
    bits: int
    keys: torch.Tensor
    keys_pre: torch.Tensor | None
    values: torch.Tensor
    outliers: list[int]
    errors: dict[str, torch.Tensor]

    @property
    def key_peaks(self) -> torch.Tensor:
        return (self.keys if self.keys_pre is None else self.keys_pre).amax(0)

    @property
    def key_means(self) -> torch.Tensor:
        return (self.keys if self.keys_pre is None else self.keys_pre).mean(0)

    @property
    def value_peaks(self) -> torch.Tensor:
        return self.values.amax(0)


def outliers_of(keys: torch.Tensor, factor: float = OUTLIER_FACTOR) -> list[list[int]]:
    """Per KV head of ``keys`` ``(KV, n, D)``: the channels whose max |k| over the slots is at least ``factor`` ×
    the median channel's, ascending."""
    peak = keys.float().abs().amax(1)  # (KV, D)
    floor = factor * peak.median(-1, keepdim=True).values
    return [row.nonzero()[:, 0].tolist() for row in peak >= floor]


def pre_rope_keys(session: Session, layer: int, at: int) -> torch.Tensor | None:
    """The keys of ``layer`` before RoPE ``(KV, at, D)`` float32, or None for a model without a plain RoPE or whose
    cached keys carry none (a latent cache: its RoPE key is held as the values)."""
    from kvviz.rope import Rotary

    if session.lm.attention.latent is not None:
        return None
    try:
        rotary = Rotary.for_layer(session.lm, layer)
    except KvvizError:
        return None
    keys = session.layer_kv(layer)[0][:, :at].float()
    positions = torch.tensor([s.position for s in session.transcript.slots[:at]])
    return rotary.rotate(keys, -positions)


def channels(session: Session, layer: int, kv_head: int, at: int | None = None, bits: int = 2) -> Channels:
    """The channel view of ``layer``'s KV head ``kv_head`` over the slots before ``at`` (default: all cached)."""
    lm = session.lm
    at = len(session) if at is None else at
    if not 0 <= layer < lm.layers or not 0 <= kv_head < lm.kv_heads:
        raise KvvizError(f"layer {layer} / KV head {kv_head} do not exist ({lm.layers} layers, {lm.kv_heads} KV heads)")
    if not 1 <= at <= len(session):
        raise KvvizError(f"no cached slot before slot {at}")
    keys, values = (t[kv_head:kv_head + 1, :at].float() for t in session.layer_kv(layer))
    pre = pre_rope_keys(session, layer, at)
    pre = None if pre is None else pre[kv_head:kv_head + 1]
    errors = {}
    width = lm.geometry.cached_widths[0]  # a key's channels (a latent cache: the latent's)
    for name, quantizer in QUANTIZERS.items():
        try:
            quantizer.check(width)
        except KvvizError:
            continue  # e.g. a Hadamard rotation of a head dimension that is not a power of two
        errors[name] = (fake_quantize(keys, bits, quantizer) - keys)[0].square().mean(0).sqrt()
    if bits == 4:  # NVFP4's tensor scale spans the layer's KV heads: rounded with them, this head's error kept
        layer_keys = session.layer_kv(layer)[0][:, :at].float()
        for name, quantizer in FP4_QUANTIZERS.items():
            if width % quantizer.group_size == 0:
                errors[name] = (fake_quantize(layer_keys, 4, quantizer) - layer_keys)[kv_head].square().mean(0).sqrt()
    return Channels(layer, kv_head, at, bits, keys[0].abs(), None if pre is None else pre[0].abs(), values[0].abs(),
                    outliers_of(keys if pre is None else pre)[0], errors)


def outliers_by_layer(session: Session, at: int | None = None) -> list[list[list[int]]]:
    """Every layer's outlier key channels per KV head (pre-RoPE where there is RoPE): ``[layer][kv_head]``."""
    at = len(session) if at is None else at
    found = []
    for layer in range(session.lm.layers):
        pre = pre_rope_keys(session, layer, at)
        found.append(outliers_of(session.layer_kv(layer)[0][:, :at] if pre is None else pre))
    return found
