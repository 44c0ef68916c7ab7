"""Sparse selection (DeepSeek Sparse Attention, DSA: DeepSeek-V3.2, GLM-5) as kvviz runs it (docs/math.md §2).

A DSA layer is an MLA layer (:mod:`kvviz.latent`) whose attention reads only some cached slots. Its *lightning
indexer* keeps a key of its own per token (``index_head_dim`` wide, in the cache beside the latent) and scores every
slot ``s`` for each query ``t``: ``I(t, s) = Σ_j w_j(t) · ReLU(q_j(t) · k(s)) / √d`` (``index_n_heads`` heads ``j``);
the query reads the ``index_topk`` slots of highest score (all of them while fewer are cached). The full cache is
kept; each step reads a subset of it.

kvviz runs the model's own indexer and lets its attention function make the choice. :func:`install` makes each
indexer return a :class:`Selection`, the scores the indexer computed (its own code, read where it takes the top-k),
instead of its top-k; kvviz's attention function then takes the top-k among the slots its probe leaves visible
(:meth:`Selection.read`). That is what the model's indexer does on a cache from which the hidden slots are removed —
the slots kept score the same — so an eviction brings the next slots of the indexer's ranking into the read set, as
it would in the model. The probe is told each read set and the scores (:meth:`kvviz.recorder.Probe.on_read`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode


@dataclass(frozen=True)
class Selection:
    """An indexer's scores ``(B, q, n)`` float32 (causally masked: −inf after each row's slot) and its ``topk``."""

    scores: torch.Tensor
    topk: int

    def read(self, allowed: torch.Tensor) -> torch.Tensor:
        """Bool ``(B, q, n)``: the slots each row reads among those ``allowed`` (bool ``(B, q, n)``): the ``topk`` of
        highest score (all allowed ones while they are fewer)."""
        return top(self.scores, allowed, self.topk)


def top(scores: torch.Tensor, allowed: torch.Tensor, topk: int) -> torch.Tensor:
    """Bool like ``scores`` ``(..., n)``: per row the ``topk`` ``allowed`` slots of highest score — the indexer's
    ``topk`` on a cache holding the allowed slots alone (``torch.topk``, as the model takes it)."""
    masked = scores.masked_fill(~allowed, float("-inf"))
    chosen = masked.topk(min(topk, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(allowed).scatter_(-1, chosen, True) & allowed


def indexers(modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The DSA indexers of attention ``modules`` (empty: the model selects no slots)."""
    return [module.indexer for module in modules if getattr(module, "indexer", None) is not None]


class _TopkInput(TorchFunctionMode):
    """Keeps the tensor the code in its block takes ``topk`` of (the indexer's scores)."""

    scores: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.topk, torch.topk):
            self.scores = args[0]
        return func(*args, **(kwargs or {}))


def install(modules: list[torch.nn.Module]) -> None:
    """Make the indexer of each DSA attention module return a :class:`Selection` (idempotent): the model's own
    indexer runs (it stores its keys in the cache) and its scores are kept where it would take their top-k."""
    for indexer in indexers(modules):
        if getattr(indexer, "_kvviz_selects", False):
            continue
        forward = indexer.forward

        def selecting(*args, forward=forward, indexer=indexer, **kwargs) -> Selection:
            with _TopkInput() as seen:
                forward(*args, **kwargs)
            if seen.scores is None:
                raise RuntimeError("a DSA indexer that took no top-k of its scores")
            return Selection(seen.scores, indexer.index_topk)

        indexer.forward, indexer._kvviz_selects = selecting, True


def top_count(config) -> int | None:
    """How many slots a DSA model's query reads (``index_topk``; None: the model reads every slot)."""
    return getattr(config, "index_topk", None) if getattr(config, "index_n_heads", None) else None
