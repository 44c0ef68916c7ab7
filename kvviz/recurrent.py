"""Hybrid models (Qwen3-Next, Qwen3.5): decoder layers that keep a recurrent state instead of K/V (docs/math.md §2).

In a hybrid model only some layers attend over a KV cache; the others ("linear attention", a Gated DeltaNet) keep a
state of fixed size — the last few inputs of a short convolution and one matrix per head — that every token updates.
kvviz's layer axis counts the KV layers alone (:func:`kv_layers` maps it to the decoder's layers): the strip, the
edits and the policies touch only them, and a recurrent layer sees every token, as in the model.

A what-if re-runs the step of slot ``at`` on the K/V of slots ``0..at-1``; a recurrent layer must then start from its
state as it stood before that slot. The session records each recurrent layer's input per slot (its query log's
``inputs``, :class:`~kvviz.recorder.QueryLog`) and :func:`states_at` rebuilds the state before any slot by running
the layer's own module on those inputs — the same function of the same numbers, summed in another order than the
chat's chunked prefill and one-token decode steps (float32 rounding, no other difference). Before the pending slot
the live cache's own state is used as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin, LinearAttentionLayer

from kvviz.recorder import Probe, QueryLog, current_probe, probing

LINEAR = "linear_attention"
State = tuple[torch.Tensor, torch.Tensor]  # a recurrent layer's conv state (B, C, kernel) and recurrent state


def linear_layers(config) -> tuple[int, ...]:
    """The decoder layers of ``config`` that keep a recurrent state, not K/V (empty: a model without any)."""
    types = getattr(config, "layer_types", None) or ()
    return tuple(index for index, kind in enumerate(types[: config.num_hidden_layers]) if kind == LINEAR)


def kv_layers(config) -> tuple[int, ...]:
    """The decoder layers of ``config`` that cache K/V, in order: kvviz's layer ``l`` is decoder layer
    ``kv_layers(config)[l]``."""
    linear = set(linear_layers(config))
    return tuple(index for index in range(config.num_hidden_layers) if index not in linear)


def mixers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The token mixers of the recurrent layers, in layer order (transformers' ``linear_attn`` modules)."""
    return [layer.linear_attn for layer in getattr(getattr(model, "model", None), "layers", ())
            if hasattr(layer, "linear_attn")]


def problems(model: torch.nn.Module) -> list[str]:
    """What in a hybrid model's recurrent layers kvviz cannot rebuild (empty: nothing, or no recurrent layer)."""
    linear = linear_layers(model.config)
    if not linear:
        return []
    found = mixers(model)
    if len(found) != len(linear) or any(getattr(m, "layer_idx", None) != i for m, i in zip(found, linear)):
        return ["linear-attention layers without transformers' linear_attn modules"]
    return []


def install(model: torch.nn.Module, attention: Sequence[torch.nn.Module]) -> None:
    """Number a hybrid model's layers as kvviz counts them and make each recurrent layer report its input (idempotent):
    every attention module gets ``kvviz_layer`` (its KV layer), every recurrent mixer ``kvviz_mixer`` (its place among
    the recurrent layers) and a hook that hands its input ``(B, q, hidden)`` to the active probe (``on_mixer``)."""
    for index, module in enumerate(attention):
        module.kvviz_layer = index
    for index, module in enumerate(mixers(model)):
        if getattr(module, "kvviz_mixer", None) is None:
            module.register_forward_pre_hook(_report, with_kwargs=True)
        module.kvviz_mixer = index


def _report(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    probe = current_probe()
    if probe is not None:
        probe.on_mixer(module.kvviz_mixer, kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])


def states_at(model: torch.nn.Module, inputs: QueryLog, at: int) -> dict[int, State | None]:
    """Each recurrent layer's state before slot ``at`` (decoder layer → its conv and recurrent state; None before slot
    0), rebuilt from the recorded inputs ``(1, n, hidden)`` of slots ``0..at-1`` by the layer's own module."""
    layers = linear_layers(model.config)
    if not at:
        return dict.fromkeys(layers)
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), probing(Probe()):  # a replay reports to no probe
        for index, (layer, module) in enumerate(zip(layers, mixers(model))):
            module(hidden_states=inputs.layer(index)[:, :at], cache=cache)
    return {layer: (cache.layers[layer].conv_states[0], cache.layers[layer].recurrent_states[0]) for layer in layers}


def live_states(cache) -> dict[int, State | None]:
    """The recurrent layers' states a cache holds now (decoder layer → conv and recurrent state, None when unset)."""
    return {index: (entry.conv_states[0], entry.recurrent_states[0]) if entry.has_previous_state[0] else None
            for index, entry in enumerate(cache.layers) if isinstance(entry, LinearAttentionCacheLayerMixin)}


def layers(states: dict[int, State | None]) -> dict[int, LinearAttentionLayer]:
    """Cache layers starting from ``states`` (copies: a pass on them leaves ``states`` as they are), by decoder
    layer."""
    made = {}
    for index, state in states.items():
        entry = made[index] = LinearAttentionLayer()
        if state is not None:
            conv, recurrent = state
            entry.conv_states[0], entry.recurrent_states[0] = conv.clone(), recurrent.clone()
            entry.conv_kernel_size[0], entry.device, entry.dtype = conv.shape[-1], conv.device, conv.dtype
            entry.is_conv_states_initialized[0] = entry.is_recurrent_states_initialized[0] = True
            entry.has_previous_state[0] = True
    return made


def snapshot(cache) -> dict[int, LinearAttentionLayer]:
    """Copies of ``cache``'s recurrent layers as they are now, for :func:`place` (empty without any)."""
    return layers(live_states(cache))


def place(cache, recurrent: dict[int, LinearAttentionLayer]) -> None:
    """Make ``recurrent`` (decoder layer → cache layer: :func:`layers`, :func:`snapshot`) ``cache``'s recurrent
    layers: a cache built from K/V alone given its states, or a cache put back after a pass that failed."""
    for index, entry in recurrent.items():
        cache.layers[index] = entry


def nbytes(cache) -> int:
    """Bytes of the recurrent states ``cache`` holds."""
    return sum(t.numel() * t.element_size() for state in live_states(cache).values() if state is not None
               for t in state)
