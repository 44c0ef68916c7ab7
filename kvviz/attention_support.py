"""What kvviz reproduces of a model's attention, checked when the model loads (docs/math.md §2).

kvviz recomputes attention weights from recorded queries and cached keys, and re-runs steps with slots hidden. That is
exact for causal softmax attention over every cached slot with one score scale. A model whose attention adds
something kvviz does not reproduce yet is refused with a line naming it, never shown with wrong numbers:
sliding-window layers (Mistral with a window, Gemma 2 / 3), attention soft-capping (Gemma 2), learned attention sinks
(gpt-oss), and attention modules that differ in their score scale.
"""

from __future__ import annotations

import torch

from kvviz.errors import ModelLoadError


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer, in layer order."""
    return [module for name, module in model.named_modules() if name.endswith("self_attn")]


def unsupported(model: torch.nn.Module) -> list[str]:
    """What the model's attention does that kvviz cannot reproduce (empty: everything is supported)."""
    config = model.config
    problems = []
    modules = attention_modules(model)
    if len(modules) != config.num_hidden_layers:
        problems.append(f"{len(modules)} attention modules for {config.num_hidden_layers} layers")
    window = _window(config, modules)
    if window is not None:
        problems.append(f"sliding-window layers (window {window})")
    caps = {c for m in modules if (c := getattr(m, "attn_logit_softcapping", None))}
    if caps or getattr(config, "attn_logit_softcapping", None):
        problems.append(f"attention soft-capping (cap {', '.join(map(str, caps)) or config.attn_logit_softcapping})")
    if any(getattr(m, "sinks", None) is not None for m in modules):
        problems.append("learned attention sinks")
    scales = {getattr(m, "scaling", None) for m in modules}
    if len(scales) != 1 or None in scales:
        problems.append("attention modules without one shared score scale")
    return problems


def _window(config, modules: list[torch.nn.Module]) -> int | None:
    """The sliding window some layer applies within the context window, else None. Configs with ``layer_types`` say
    per layer; older ones (Mistral, Qwen2) have one ``sliding_window``, on unless ``use_sliding_window`` is false."""
    windows = {w for m in modules if (w := getattr(m, "sliding_window", None))}
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        if "sliding_attention" not in layer_types:
            windows = set()
        else:
            windows.add(config.sliding_window)
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        windows.add(config.sliding_window)
    inside = sorted(w for w in windows if w and w < config.max_position_embeddings)
    return inside[0] if inside else None


def check(model: torch.nn.Module, name: str) -> float:
    """Refuse a model kvviz cannot reproduce (one line naming what is missing); return its score scale."""
    problems = unsupported(model)
    if problems:
        raise ModelLoadError(f"{name} ({model.config.model_type}) uses {'; '.join(problems)}, which kvviz cannot "
                             "reproduce yet; its numbers would be wrong, so it is not loaded")
    return float(attention_modules(model)[0].scaling)
