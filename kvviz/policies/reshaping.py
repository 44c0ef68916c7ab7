"""Edits that change the cache rather than only hide slots, chosen as the methods that introduced them choose:

- :func:`think` — ThinK (Xu et al., "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR 2025; kvpress'
  ``ThinKPress``): per layer and KV head, channel ``c`` of the keys scores ``mean_w(q_c²) · mean_j(k_c²)`` — the
  last ``window`` queries before the step (averaged over the group's query heads) against every cached key — and the
  ``int(D·ratio)`` lowest-scoring channels are zeroed in every slot before the step.
- :func:`merging` — kvpress' ``MergingPress`` (after D2O, Wan et al. 2024, and token merging): per layer and KV
  head, each evicted slot folds its value into the kept slot whose key is most cosine-similar, with weight
  ``max(cos, 0) · ‖v_e‖ / (‖v_e‖ + ‖v_t‖ + 10⁻⁶)`` (``rule="average"``); merges under ``threshold`` similarity, or
  outside the ``fraction`` most similar, are dropped (the slot is evicted plainly).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvviz.edit.parts import Merge, Pruning
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.session import Session

EPS = 1e-6  # kvpress' MergingPress: norms clamped, and the weight's denominator


def _latent(lm, what: str) -> None:
    """Refuse a reshape on a latent cache (MLA), whose channels are shared by every head's key and value."""
    if lm.attention.latent is not None:
        raise KvvizError(f"{what}; this model caches one latent per token (MLA), whose channels every head's key and "
                         "value share: not built on it yet")


def think(session: Session, ratio: float, window: int = 32, at: int | None = None) -> tuple[Pruning, ...]:
    """ThinK's prunings for the step of slot ``at`` (default: the newest cached slot; ``len(session)``: the step
    about to be taken): ``int(D·ratio)`` key channels of every slot ``0..at-1`` per layer and KV head."""
    lm = session.lm
    _latent(lm, "ThinK prunes key channels per KV head")
    at = len(session) - 1 if at is None else at
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        raise KvvizError(f"ThinK's channel ratio must be in [0, 1), got {ratio!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise KvvizError(f"ThinK's window must be a positive integer, got {window!r}")
    if not 0 < at <= len(session):  # at == len: the step about to be taken (a policy run, after a prompt)
        raise KvvizError(f"slot {at} has no cached slot before it to prune")
    count = int(lm.head_dim * ratio)
    if count == 0:
        return ()
    rows, groups = slice(max(0, at - window), at), lm.heads // lm.kv_heads
    prunings = []
    for layer in range(lm.layers):
        queries = session.queries.layer(layer)[:, rows].float()  # (H, w, D) post-RoPE, as kvpress recomputes them
        query_norm = queries.pow(2).mean(1).reshape(lm.kv_heads, groups, -1).mean(1)  # (KV, D)
        key_norm = session.layer_kv(layer)[0][:, :at].float().pow(2).mean(1)  # (KV, D)
        pruned = (query_norm * key_norm).topk(count, dim=-1, largest=False).indices.cpu()  # (KV, count)
        prunings += [Pruning(layer, head, tuple(pruned[head].tolist()), tuple(range(at))) for head in range(lm.kv_heads)]
    return tuple(prunings)


def merging(session: Session, evicted: torch.Tensor, at: int, threshold: float = 0.0, fraction: float = 1.0,
            kept: torch.Tensor | None = None) -> tuple[Merge, ...]:
    """``MergingPress``' merges of the slots ``evicted`` (bool ``(L, KV, at)``) for the step of slot ``at``: each
    into its most similar slot of ``kept`` (default: the others), with its weight (weights of 0 are left out: those
    slots are evicted plainly)."""
    lm = session.lm
    _latent(lm, "merging folds values into kept slots per KV head")
    if not 0 <= threshold <= 1 or not 0 < fraction <= 1:
        raise KvvizError("a merge's similarity threshold must be in [0, 1] and its fraction in (0, 1]")
    merges = []
    for layer in range(lm.layers):
        keys, values = (t[:, :at].float() for t in session.layer_kv(layer))  # (KV, at, D)
        for head in range(lm.kv_heads):
            gone = evicted[layer, head].to(keys.device)
            stay = ~gone if kept is None else kept[layer, head].to(keys.device)
            sources, targets_of = gone.nonzero()[:, 0], stay.nonzero()[:, 0]
            if len(sources) == 0 or len(targets_of) == 0:
                continue
            unit = keys[head] / keys[head].norm(dim=-1, keepdim=True).clamp(min=EPS)
            similarity, nearest = (unit[sources] @ unit[targets_of].T).max(-1)
            chosen = similarity >= threshold
            if fraction < 1 and bool(chosen.any()):
                cut = similarity.masked_fill(~chosen, float("-inf")).quantile(1 - fraction)
                chosen &= similarity >= cut
            targets = targets_of[nearest]
            own, target = values[head, sources].norm(dim=-1), values[head, targets].norm(dim=-1)
            weights = similarity.clamp(min=0) * chosen.float() * own / (own + target + EPS)
            merges += [Merge(layer, head, int(s), int(t), float(w))
                       for s, t, w in zip(sources.tolist(), targets.tolist(), weights.tolist()) if w > 0]
    return tuple(merges)


def merge_evicted(session: Session, edit: Edit, at: int | None = None, threshold: float = 0.0,
                  fraction: float = 1.0) -> Edit:
    """``edit`` with its evicted slots (on top of the committed edit) merged as :func:`merging` merges them."""
    lm = session.lm
    at = len(session) - 1 if at is None else at
    _, whole = session.commits.step_edits(at, edit)
    evicted = whole.evicted_mask(at, lm.layers, lm.kv_heads).cpu()
    committed = session.commits.edit_at(at).evicted_mask(at, lm.layers, lm.kv_heads).cpu()
    return replace(edit, merges=edit.merges + merging(session, evicted & ~committed, at, threshold, fraction, ~evicted))
