"""RoPE in one place: a rotation by any number of positions, the model's frequencies, and re-rotated positions.

RoPE turns each channel pair ``(x_i, x_{i+D/2})`` of a query or key by the angle ``p·θ_i`` of its position ``p``
(transformers' ``rotate_half`` layout). Keys are cached post-RoPE at the position they were computed at, so the key at
another position ``c`` is the cached one turned by ``c − p`` (docs/math.md §9), and a key before RoPE is the cached one
turned by ``−p`` (what a pre-RoPE key quantizer rounds, docs/math.md §4). Re-rotated positions (StreamingLLM's
"positions within the cache") turn the kept keys to the positions ``0..k-1`` of their order after each compression;
a run keeps the keys as computed and turns them from there each time, so rotations never accumulate rounding.

Some models leave RoPE out of some layers (SmolLM3's NoPE layers, transformers' ``self_attn.use_rope``): their keys
carry no position, so moving a slot leaves its key as it is, and the key as cached is already the key before RoPE. A
NoPE layer is RoPE with every frequency 0 — a rotation by any angle 0 — and that is how it is treated here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from kvviz.errors import KvvizError

if TYPE_CHECKING:  # the model's module loads transformers; a rotation needs only torch
    from kvviz.model import LoadedModel


def rope_rotate(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., n, D)`` rotated by ``delta`` ``(n,)`` positions each, with RoPE frequencies ``inv_freq``
    ``(D/2,)``: channel pair ``(x_i, x_{i+D/2})`` turned by the angle ``δ·θ_i`` (transformers' ``rotate_half`` layout,
    float32 angles as the model computes them). A negative ``delta`` undoes a rotation. With partial RoPE (fewer
    frequencies than ``D/2``: Qwen3-Next, Qwen3.5) the first ``2·len(θ)`` channels turn and the others stay."""
    turned = 2 * inv_freq.shape[-1]
    if turned < x.shape[-1]:
        return torch.cat((rope_rotate(x[..., :turned], delta, inv_freq), x[..., turned:]), dim=-1)
    freqs = delta.to(inv_freq.device, torch.float32)[:, None] * inv_freq  # (n, D/2)
    emb = torch.cat((freqs, freqs), dim=-1).to(x.device)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated_half * sin


ROTATIONS = ("default", "linear", "llama3", "yarn")  # RoPE variants whose angle is position × a fixed frequency
# (YaRN also multiplies cos and sin by one attention factor: a constant in every cached key, which a rotation keeps)


def no_rope_layers(lm: LoadedModel) -> tuple[int, ...]:
    """The layers of ``lm`` whose attention applies no RoPE (SmolLM3's NoPE layers: transformers' ``use_rope``)."""
    return tuple(index for index, module in enumerate(lm.attention_modules) if not getattr(module, "use_rope", True))


class Rotary:
    """The model's RoPE frequencies ``θ`` ``(D/2,)``: rotating by ``δ`` positions multiplies each channel pair
    ``(x_i, x_{i+D/2})`` by the angle ``δ·θ_i`` (transformers' ``rotate_half`` layout); in the layers ``nope`` (no
    RoPE) it leaves a key as it is. With latent attention the position is in the RoPE key alone (the cache's values,
    :attr:`part`), which transformers stores in that layout too (DeepSeek's interleaved weights are permuted before
    the rotation)."""

    part = 0  # which cached tensor carries the position: 0 the keys; 1 the values, a latent cache's RoPE key (MLA)

    def __init__(self, lm: LoadedModel):
        rotary = getattr(getattr(lm.model, "model", None), "rotary_emb", None)
        kind = getattr(rotary, "rope_type", None)
        if rotary is None or kind not in ROTATIONS:
            raise KvvizError(f"re-rotated positions need a plain RoPE model ({', '.join(ROTATIONS)}); "
                             f"{lm.name} has {kind or 'no RoPE'}: use original positions")
        self.inv_freq = rotary.inv_freq.detach().float()
        self.nope = frozenset(no_rope_layers(lm))
        self.part = 0 if lm.attention.latent is None else 1  # the RoPE key, stored in the rotate_half layout

    @classmethod
    def for_layer(cls, lm: LoadedModel, layer: int) -> Rotary:
        """The RoPE of ``layer``: the model's, its layer type's where layer types have their own (Gemma 3), or none
        (every frequency 0) in a NoPE layer."""
        rotary = getattr(getattr(lm.model, "model", None), "rotary_emb", None)
        types = getattr(rotary, "layer_types", None)
        if not types:
            found = cls(lm)
            if layer in found.nope:
                found.inv_freq = torch.zeros_like(found.inv_freq)
            return found
        kind = rotary.config.layer_types[layer]
        if rotary.rope_type[kind] not in ROTATIONS:
            raise KvvizError(f"{lm.name}'s {kind} layers use {rotary.rope_type[kind]} RoPE, not a plain rotation")
        found = cls.__new__(cls)
        found.inv_freq = getattr(rotary, f"{kind}_inv_freq").detach().float()
        found.nope = frozenset()
        return found

    def rotate(self, keys: torch.Tensor, delta: torch.Tensor, layer: int | None = None) -> torch.Tensor:
        """``keys`` ``(..., n, D)`` (of ``layer``) rotated by ``delta`` ``(n,)`` positions each (float32 angles, as
        the model); a copy as they are in a NoPE layer."""
        return keys.clone() if layer in self.nope else rope_rotate(keys, delta, self.inv_freq)


@lru_cache(maxsize=4)
def rope_frequencies(lm: LoadedModel) -> tuple[float, ...]:
    """The RoPE frequencies ``θ`` ``(D/2,)`` every layer of ``lm`` that applies RoPE shares (what a pre-RoPE key
    quantizer needs, with :func:`no_rope_layers`); refuses a model without a plain RoPE or whose layer types have their
    own (Gemma 3). Memoized per model: the app and every pre-RoPE check ask for it."""
    nope = no_rope_layers(lm)
    found = {tuple(Rotary.for_layer(lm, layer).inv_freq.tolist()) for layer in range(lm.layers) if layer not in nope}
    if len(found) != 1:
        raise KvvizError(f"{lm.name}'s layers use different RoPE frequencies: keys before RoPE are quantized for "
                         "models with one RoPE")
    return found.pop()


def pre_rope(lm: LoadedModel) -> dict[str, tuple]:
    """What a key quantizer needs to round ``lm``'s keys before RoPE: ``rope``, the frequencies
    (:func:`rope_frequencies`), and ``no_rope``, the layers whose keys carry none (:func:`no_rope_layers`) —
    ``Quantizer(..., **pre_rope(lm))``."""
    return {"rope": rope_frequencies(lm), "no_rope": no_rope_layers(lm)}
