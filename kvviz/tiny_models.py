"""Tiny randomly initialised decoders of the architectures kvviz supports, built from their transformers configs (no
download): for trying kvviz on an architecture offline (``load_model("tiny:KIND")``), the tests of other architectures
(with :mod:`kvviz.tiny_sessions`) and the benchmark's rows."""

from __future__ import annotations

import torch
import transformers
from transformers import AutoModelForCausalLM

from kvviz.recorder import register

COMMON = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=8,
              max_position_embeddings=1024, initializer_range=0.2, tie_word_embeddings=True)
WINDOW = 16  # sliding windows shorter than the tests' conversations
ARCHITECTURES = {  # each with a GQA ratio other than the bundled model's 3
    "llama": ("LlamaConfig", dict(num_key_value_heads=2)),
    "mistral": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=WINDOW)),  # every layer windowed
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=WINDOW,
                                  max_window_layers=1)),  # biases on q, k, v; layers from 1 on windowed
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=4, head_dim=16)),  # q/k norms; head_dim ≠ hidden / heads
    "phi3": ("Phi3Config", dict(num_key_value_heads=4, pad_token_id=0)),  # fused qkv projection
    "gemma2": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=32,
                                    attn_logit_softcapping=2.0)),  # soft-cap low enough to bite; local / global
    "gemma3": ("Gemma3TextConfig", dict(num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
                                        layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    "smollm3": ("SmolLM3Config", dict(num_key_value_heads=2, no_rope_layer_interval=2, pad_token_id=None,
                                      bos_token_id=None, eos_token_id=None)),  # layer 1 of 3 applies no RoPE (NoPE)
    "gpt_oss": ("GptOssConfig", dict(num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, num_local_experts=2,
                                     num_experts_per_tok=1, rope_parameters=dict(
                                         rope_type="yarn", rope_theta=150000.0, factor=8.0, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False, original_max_position_embeddings=128))),
    # learned sinks (drawn by `tiny` so they bite), sliding / full layers alternating, YaRN RoPE, a mixture of experts
    "deepseek_v3": ("DeepseekV3Config", dict(num_key_value_heads=8, **(LATENT := dict(
        kv_lora_rank=256, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, num_experts_per_tok=2,
        n_group=1, topk_group=1, moe_intermediate_size=32, pad_token_id=None, bos_token_id=None, eos_token_id=None)),
        n_routed_experts=4, first_k_dense_replace=1)),
    # latent attention (MLA): a 256-wide latent (two of fp8_ds_mla's 128-channel tiles) and an 8-wide RoPE key per
    # token, interleaved RoPE, value heads narrower than query heads; a mixture of experts from layer 1 on
    "deepseek_v32": ("DeepseekV32Config", dict(num_key_value_heads=8, **LATENT, num_local_experts=4,
                                               mlp_layer_types=["dense", "sparse", "sparse"], index_topk=12,
                                               index_n_heads=8, index_head_dim=16)),
    # the same latent, each query reading the 12 slots its lightning indexer (8 heads, 16-wide keys) scores highest
    # (DSA); no pad token: a zeroed embedding row would tie the indexer's scores
    "qwen3_next": ("Qwen3NextConfig", dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, **(HYBRID := dict(
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"], pad_token_id=None,
        bos_token_id=None, eos_token_id=None)), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32)),
    # hybrid: Gated DeltaNet layers 0 and 2 keep a recurrent state, no K/V; layers 1 and 3 attend, their output gated
    # per head, a quarter of each head's channels rotated (partial RoPE); a mixture of experts with a shared expert
    "qwen3_5": ("Qwen3_5TextConfig", dict(num_hidden_layers=4, num_key_value_heads=4, head_dim=16, **HYBRID)),
    # the same hybrid layout with a dense MLP (Qwen3.5's text model)
}
SINKS = (4.0, 2.0)  # a learned sink's logit ~ N(4, 2²): some heads give it most of their mass, others little


def tiny(kind: str, attention: str = "kvviz", **overrides) -> torch.nn.Module:
    """A tiny model of ``kind`` (a key of :data:`ARCHITECTURES`, or a transformers config class name), seeded."""
    register()
    name, settings = ARCHITECTURES[kind] if kind in ARCHITECTURES else (kind, {})
    config = getattr(transformers, name)(**{**COMMON, **settings, **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32).eval()
    with torch.no_grad():  # the config's initializer draws sinks near 0, where they would hardly change a weight
        for module in model.modules():
            if isinstance(getattr(module, "sinks", None), torch.Tensor):
                module.sinks.normal_(*SINKS)
    return model
