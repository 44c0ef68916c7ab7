"""The shape of a decoder that kvviz's numbers depend on, read from its transformers config (a plain mapping)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Geometry:
    """Layers, query heads, KV heads (GQA: each serves ``heads // kv_heads`` query heads), head dim, vocabulary size
    and context window."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context_window: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Geometry:
        """From a config's fields (``config.to_dict()`` or a ``config.json``)."""
        heads = config["num_attention_heads"]
        return cls(layers=config["num_hidden_layers"], heads=heads,
                   kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   vocab=config["vocab_size"], context_window=config["max_position_embeddings"])
