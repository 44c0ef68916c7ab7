"""What kvviz reproduces of a model's attention, read and checked when the model loads (docs/math.md §2).

kvviz recomputes attention weights from recorded queries and cached keys, and re-runs steps with slots hidden. It
reproduces causal softmax attention with one score scale, an optional soft-cap of the scores (Gemma 2), a sliding
window per layer (Mistral, Qwen2 with ``use_sliding_window``, Gemma 2 / 3, gpt-oss) and learned attention sinks per
layer and head (gpt-oss), and multi-head latent attention (DeepSeek's MLA, read in its absorbed form:
:mod:`kvviz.latent`): an :class:`AttentionRule`. A model whose queries read an indexer's top-k slots (DSA,
:mod:`kvviz.sparse`) is the same rule over the slots each query read. In a hybrid model (Qwen3-Next, Qwen3.5) the rule is that of its KV
layers, and the recurrent layers between them are :mod:`kvviz.recurrent`'s. A model whose attention adds something
else is refused with a line naming it, never shown with wrong numbers: chunked or other non-causal layers,
bidirectional windows, attention modules that differ in their score scale or soft-cap."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import get_layer_types_and_kwargs

from kvviz import attention_math as am
from kvviz import latent as mla
from kvviz import recurrent, sparse
from kvviz.errors import ModelLoadError


@dataclass(frozen=True)
class AttentionRule:
    """What a model's attention applies between ``q·kᵀ`` and the softmax: the score ``scaling``, a ``softcap``
    ``c`` (scores become ``c·tanh(s/c)``; None: none) and each layer's sliding window (None: the layer sees every
    earlier slot). kvviz keeps every slot in every layer; a window only hides slots, as the model's mask does.
    ``sinks``: each layer's learned sink logit per query head (gpt-oss; empty: none), one more term in the softmax's
    denominator with no value (docs/math.md §3). ``latent``: the up-projections of a model with latent attention
    (MLA; None: none): its cache's "keys" are then the latent and its "values" the RoPE key, which :meth:`keyed`,
    :meth:`carried` and :meth:`project` read as the absorbed form does (:mod:`kvviz.latent`). ``reads``: with sparse
    selection (DSA, :mod:`kvviz.sparse`), how many slots each query reads, the top of its indexer's scores (None:
    every slot)."""

    scaling: float
    softcap: float | None = None
    windows: tuple[int | None, ...] = ()  # one per layer (empty: no layer has a window)
    sinks: tuple[tuple[float, ...], ...] = ()  # (L, H) logits, as the model holds them
    latent: mla.Latent | None = field(default=None, compare=False, repr=False)
    reads: int | None = None

    def keyed(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """What a recorded query scores against, of cached ``keys`` and ``values`` ``(..., KV, n, ·)``: the keys; with
        latent attention the latent and the RoPE key side by side ``(..., 1, n, R + rope)``."""
        return keys if self.latent is None else torch.cat((keys, values), dim=-1)

    def carried(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """What the weights average, of cached ``keys`` and ``values``: the values; with latent attention the latent
        (the keys), whose average :meth:`project` turns into the heads' outputs."""
        return values if self.latent is None else keys

    def project(self, outputs: torch.Tensor) -> torch.Tensor:
        """Averages of :meth:`carried` ``(L, H, ·)`` → the heads' attention outputs ``(L, H, D)`` (the same tensor
        without latent attention)."""
        return outputs if self.latent is None else self.latent.project(outputs)

    def sink(self, layer: int | None, device: torch.device | str | None = None,
             head: int | None = None) -> torch.Tensor | None:
        """The sink logits of ``layer`` ``(H,)`` (``(1,)``: query head ``head`` alone), or with ``None`` of every
        layer ``(L, H)``; None without sinks."""
        if not self.sinks:
            return None
        found = torch.tensor(self.sinks if layer is None else self.sinks[layer], dtype=torch.float64, device=device)
        return found if head is None else found[..., head : head + 1]

    def window(self, layer: int | None) -> am.Window:
        """The window of ``layer``, or with ``None`` those of all layers (for tensors with a leading layer axis)."""
        if layer is None:
            return self.windows or None
        return self.windows[layer] if self.windows else None

    @property
    def windowed(self) -> bool:
        """Whether some layer has a sliding window."""
        return any(w is not None for w in self.windows)

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Scores ``(..., H, q, n)`` of query ``(..., H, q, D)`` and keys ``(..., KV, n, D)``, scaled and capped."""
        return am.scores(query, keys, self.scaling, self.softcap)

    def softmax(self, s: torch.Tensor, layer: int | None, evicted: torch.Tensor | None = None,
                dtype: torch.dtype | None = None, own: bool = False, head: int | None = None) -> torch.Tensor:
        """Weights from scores ``(H, q, n)`` of ``layer`` (``(L, H, q, n)`` with ``layer=None``; ``(1, q, n)`` of query
        head ``head`` alone), causal, within the layer's window, ``evicted`` slots hidden, with the layer's learned
        sinks (see :func:`~kvviz.attention_math.visible_softmax`; ``own``: ``s`` may be overwritten)."""
        return am.visible_softmax(s, evicted, dtype, self.window(layer), own, self.sink(layer, s.device, head))

    def weights(self, query: torch.Tensor, keys: torch.Tensor, layer: int | None,
                evicted: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                head: int | None = None) -> torch.Tensor:
        """Weights ``(H, q, n)`` of ``layer`` (``(L, H, q, n)`` with ``layer=None``; ``(1, q, n)`` when ``query`` is
        query head ``head``'s alone): row ``i`` is the slot ``n - q + i``."""
        return self.softmax(self.scores(query, keys), layer, evicted, dtype, own=True, head=head)

    def outside(self, at: int, n: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Bool ``(L, n)``: the slots ``0..n-1`` each layer's window hides from the query at slot ``at`` (all False
        without windows)."""
        if not self.windowed:
            return torch.zeros(len(self.windows), n, dtype=torch.bool, device=device)
        reach = torch.tensor([at - (w if w is not None else at + 1) for w in self.windows], device=device)
        return torch.arange(n, device=device) <= reach[:, None]

    def held(self, layer: int, n: int) -> int:
        """Slots ``layer`` holds between steps after ``n`` were processed: all of them, or in a window ``w`` the last
        ``w − 1`` (what transformers' sliding-window cache keeps: the next query sees them and itself)."""
        window = self.window(layer)
        return n if window is None else min(n, window - 1)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer, in layer order."""
    return [module for name, module in model.named_modules() if name.endswith("self_attn")]


def read(model: torch.nn.Module) -> tuple[AttentionRule | None, list[str]]:
    """The model's attention rule, and what its attention does that kvviz cannot reproduce (empty: everything is
    supported; the rule is then not None)."""
    config = model.config
    problems = []
    modules = attention_modules(model)
    kv_layers = recurrent.kv_layers(config)
    if len(modules) != len(kv_layers):
        problems.append(f"{len(modules)} attention modules for {len(kv_layers)} layers with a KV cache")
    problems += recurrent.problems(model)
    windows, other = _windows(config)
    indexers = sparse.indexers(modules)
    if "indexed attention" in other and indexers:  # DSA: kvviz.sparse runs the model's own indexer
        other.remove("indexed attention")
        if len(indexers) < len(modules):  # GLM-5's layers that reuse another's top-k
            other.append("indexed attention (shared-selection)")
    problems += [f"{kind} layers" for kind in other]
    if getattr(config, "use_bidirectional_attention", False):
        problems.append("bidirectional attention")
    caps = {getattr(m, "attn_logit_softcapping", None) for m in modules}
    if len(caps) > 1:
        problems.append("attention modules without one shared soft-cap")
    latent = None
    try:
        latent = mla.read(modules) if modules else None
    except ValueError as refused:
        problems.append(str(refused))
    sinks = [getattr(m, "sinks", None) for m in modules]
    if any(sink is not None for sink in sinks) and any(sink is None for sink in sinks):
        problems.append("learned attention sinks in some layers only")
    scales = {getattr(m, "scaling", None) for m in modules}
    if len(scales) != 1 or None in scales:
        problems.append("attention modules without one shared score scale")
    if problems:
        return None, problems
    softcap = caps.pop() if caps else None
    sinks = () if sinks[0] is None else tuple(tuple(sink.detach().float().tolist()) for sink in sinks)
    return AttentionRule(float(scales.pop()), None if softcap is None else float(softcap), windows, sinks,
                         latent, sparse.top_count(config)), []


def _windows(config) -> tuple[tuple[int | None, ...], list[str]]:
    """Each layer's sliding window (None: full attention, also for a window as long as the context) as transformers'
    own cache lays the layers out, and the layer kinds kvviz does not reproduce."""
    kinds, kwargs = get_layer_types_and_kwargs(config)
    windows, other = [], []
    for kind, arguments in zip(kinds, kwargs):
        if kind == recurrent.LINEAR:  # no KV: not on kvviz's layer axis
            continue
        window = arguments.get("sliding_window") if kind == "sliding_attention" else None
        if kind not in ("full_attention", "sliding_attention"):
            other.append(kind.replace("_", " "))
        windows.append(window if window and window < config.max_position_embeddings else None)
    return tuple(windows), sorted(set(other))


def check(model: torch.nn.Module, name: str) -> AttentionRule:
    """Refuse a model kvviz cannot reproduce (one line naming what is missing); return its attention rule. A model
    with latent attention is made to report its latent to kvviz's attention function (:func:`kvviz.latent.install`),
    a model with sparse selection its indexer's scores (:func:`kvviz.sparse.install`),
    a hybrid model's layers are numbered and its recurrent layers report their inputs
    (:func:`kvviz.recurrent.install`)."""
    rule, problems = read(model)
    if problems:
        raise ModelLoadError(f"{name} ({model.config.model_type}) uses {'; '.join(problems)}, which kvviz cannot "
                             "reproduce yet; its numbers would be wrong, so it is not loaded")
    modules = attention_modules(model)
    if rule.latent is not None:
        mla.install(modules)
    sparse.install(modules)
    if recurrent.linear_layers(model.config):
        recurrent.install(model, modules)
    return rule
