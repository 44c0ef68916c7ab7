"""The one adapter to transformers' ``DynamicCache`` internals: per-layer ``keys``/``values`` of shape
``(B, KV, n, D)``, keys stored post-RoPE. Everything else in kvviz goes through these functions."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig

KV = tuple[torch.Tensor, torch.Tensor]


def layer_kv(cache: DynamicCache, layer: int) -> KV:
    """Keys and values of ``layer``: two ``(B, KV, n, D)`` tensors."""
    entry = cache.layers[layer]
    return entry.keys, entry.values


def truncate(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` slots of every layer (layers a failed pass already extended are cut back)."""
    for entry in cache.layers:
        if entry.is_initialized and entry.keys.shape[2] > length:
            entry.keys = entry.keys[:, :, :length]
            entry.values = entry.values[:, :, :length]


def nbytes(cache: DynamicCache) -> int:
    """Bytes held by keys and values over all layers."""
    return sum(
        t.numel() * t.element_size() for e in cache.layers if e.is_initialized for t in (e.keys, e.values)
    )


def build(config: PretrainedConfig, tensors: list[KV]) -> DynamicCache:
    """A new ``DynamicCache`` holding the given per-layer ``(keys, values)`` themselves, not copies: ``update``
    concatenates into new tensors, so a forward pass on this cache never writes to the given ones."""
    cache = DynamicCache(config=config)
    for entry, (keys, values) in zip(cache.layers, tensors, strict=True):
        entry.lazy_initialization(keys, values)
        entry.keys, entry.values = keys, values
    return cache
