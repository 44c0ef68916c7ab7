"""The shape of a decoder that kvviz's numbers depend on, read from its transformers config (a plain mapping)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Geometry:
    """Layers, query heads, KV heads (GQA: each serves ``heads // kv_heads`` query heads), head dim (of the queries
    kvviz records and the keys they score against), vocabulary size and context window; ``key_dim`` / ``value_dim``:
    the widths of the cached keys and values where they differ from ``head_dim`` (0: they do not).

    A model with latent attention (MLA, :mod:`kvviz.latent`) has one KV head: its cache's keys are the latent
    (``kv_lora_rank`` wide), its values the RoPE key (``qk_rope_head_dim``), and a query scores against both
    (``head_dim`` their sum). A hybrid model's ``layers`` are those with a KV cache (its recurrent layers hold none,
    :mod:`kvviz.recurrent`)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context_window: int
    key_dim: int = 0
    value_dim: int = 0

    @property
    def cached_widths(self) -> tuple[int, int]:
        """The channels of one cached key and one cached value (per KV head)."""
        return self.key_dim or self.head_dim, self.value_dim or self.head_dim

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Geometry:
        """From a config's fields (``config.to_dict()`` or a ``config.json``)."""
        heads = config["num_attention_heads"]
        kinds = (config.get("layer_types") or ())[: config["num_hidden_layers"]]
        linear = sum(kind == "linear_attention" for kind in kinds)  # recurrent layers: no KV (kvviz.recurrent)
        shape = dict(layers=config["num_hidden_layers"] - linear, heads=heads, vocab=config["vocab_size"],
                     context_window=config["max_position_embeddings"])
        if config.get("kv_lora_rank"):  # latent attention: one latent and one RoPE key per token
            rank, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
            return cls(**shape, kv_heads=1, head_dim=rank + rope, key_dim=rank, value_dim=rope)
        return cls(**shape, kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads)
