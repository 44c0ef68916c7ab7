"""Re-rotated positions (StreamingLLM's "positions within the cache"): after each compression the kept keys are
rotated to the positions ``0..k-1`` of their order in the cache, and the next token takes position ``k``.

Keys are cached post-RoPE at the position they were computed at, ``p``; RoPE is a rotation, so the key at position
``c`` is the computed one rotated by ``c − p`` (docs/math.md §9). The run keeps the keys as computed and rotates them
from there each time, so rotations never accumulate rounding.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.outlier_handling import rope_rotate

ROTATIONS = ("default", "linear", "llama3")  # RoPE variants whose angle is position × a fixed frequency


class Rotary:
    """The model's RoPE frequencies ``θ`` ``(D/2,)``: rotating by ``δ`` positions multiplies each channel pair
    ``(x_i, x_{i+D/2})`` by the angle ``δ·θ_i`` (transformers' ``rotate_half`` layout)."""

    def __init__(self, lm: LoadedModel):
        rotary = getattr(getattr(lm.model, "model", None), "rotary_emb", None)
        kind = getattr(rotary, "rope_type", None)
        if rotary is None or kind not in ROTATIONS or getattr(rotary, "attention_scaling", 1.0) != 1.0:
            raise KvvizError(f"re-rotated positions need a plain RoPE model ({', '.join(ROTATIONS)}); "
                             f"{lm.name} has {kind or 'no RoPE'}: use original positions")
        self.inv_freq = rotary.inv_freq.detach().float()

    @classmethod
    def for_layer(cls, lm: LoadedModel, layer: int) -> Rotary:
        """The RoPE of ``layer``: the model's, or its layer type's where layer types have their own (Gemma 3)."""
        rotary = getattr(getattr(lm.model, "model", None), "rotary_emb", None)
        types = getattr(rotary, "layer_types", None)
        if not types:
            return cls(lm)
        kind = rotary.config.layer_types[layer]
        if rotary.rope_type[kind] not in ROTATIONS or getattr(rotary, f"{kind}_attention_scaling", 1.0) != 1.0:
            raise KvvizError(f"{lm.name}'s {kind} layers use {rotary.rope_type[kind]} RoPE, not a plain rotation")
        found = cls.__new__(cls)
        found.inv_freq = getattr(rotary, f"{kind}_inv_freq").detach().float()
        return found

    def rotate(self, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """``keys`` ``(..., n, D)`` rotated by ``delta`` ``(n,)`` positions each (float32 angles, as the model)."""
        return rope_rotate(keys, delta, self.inv_freq)


@lru_cache(maxsize=4)
def rope_frequencies(lm: LoadedModel) -> tuple[float, ...]:
    """The RoPE frequencies ``θ`` ``(D/2,)`` every layer of ``lm`` shares (what a pre-RoPE key quantizer needs);
    refuses a model without a plain RoPE or whose layer types have their own (Gemma 3). Memoized per model: the app
    and every pre-RoPE check ask for it."""
    found = {tuple(Rotary.for_layer(lm, layer).inv_freq.tolist()) for layer in range(lm.layers)}
    if len(found) != 1:
        raise KvvizError(f"{lm.name}'s layers use different RoPE frequencies: keys before RoPE are quantized for "
                         "models with one RoPE")
    return found.pop()
