"""R-KV — Cai et al., "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models" (2025); reference code: the
R-KV repository's ``R1KV`` (``rkv/compression/r1_kv.py``, its helpers in ``rkv/utils.py``) and its serving policy
(``rkv/serving.py``).

Made for long reasoning traces, it keeps the tokens that matter *and* differ from the rest. Per layer and KV head, over
the cache as it stands (the last ``window`` slots always kept):

- importance: the last ``window`` queries' logits ``q·k/√d``, the largest over a group's query heads, softmaxed over
  the slots before the window, averaged over the window's rows, max-pooled over ``kernel`` neighbours;
- redundancy: each key's cosine similarity to the other keys (above ``threshold`` a pair counts as similar; each row
  forgives its most recent similar key — ``retain="last"``), averaged over the rows, softmaxed over the keys;
- score ``mix · importance − (1 − mix) · redundancy``; the best ``budget − window`` are kept.

In a run (``after_steps``, ``every`` = ``buffer``: the serving loop's cadence) the cache is compressed back to the
budget after every ``buffer`` decoded tokens, once it holds ``budget + buffer`` slots; a one-shot decision compresses
whenever the cache exceeds the budget (``R1KV.update_kv``). R-KV's compacted cache is in ``torch.topk``'s order (by
score) followed by the window, and its pooling and its "most recent similar key" run over that order:
``order="cache"`` (the default) keeps that order between a run's decisions, ``order="slots"`` pools over neighbouring
slots instead. Defaults: the serving policy's (window 8, kernel 7, mix 0.1, buffer 128; ``R1KV``'s own class
defaults to mix 0.07).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, Policy, checked_choices, choice, positive
from kvviz.policies.decision import Decision


@dataclass(frozen=True)
class RKV(Policy):
    name = "r_kv"

    window: int = 8  # the last queries that vote, whose own slots are always kept
    kernel: int = 7  # max pooling over neighbouring slots (odd)
    mix: float = 0.1  # weight of importance against redundancy (serving's mix_lambda; R1KV's class: 0.07)
    buffer: int = 128  # in a run: decoded tokens between compressions, and the slots above the budget before one
    threshold: float = 0.5  # cosine similarity above which two keys count as similar
    retain: str = choice("last", "first")  # which similar key a row forgives: its most recent (R-KV) or first
    order: str = choice("cache", "slots")  # pool over R-KV's cache order (topk's) or over slots: the module doc

    def __post_init__(self) -> None:
        positive(self, "window", "kernel", "buffer")
        if self.kernel % 2 == 0:
            raise KvvizError(f"r_kv's kernel must be odd (centred pooling), got {self.kernel}")
        if not 0 <= self.mix <= 1:
            raise KvvizError(f"r_kv's mix must be in [0, 1], got {self.mix}")
        if self.buffer < self.window:
            raise KvvizError(f"r_kv's buffer ({self.buffer}) must hold its window ({self.window})")
        checked_choices(self)

    def protected(self, at: int, keep: int) -> int:
        return min(self.window, at)

    def budgets(self, candidates: Candidates, scores: torch.Tensor) -> torch.Tensor:
        """``keep`` per layer and KV head; in a run, everything while the cache holds fewer than ``keep + buffer``."""
        held = candidates.alive.sum(-1)
        if candidates.scratch is None:
            return torch.full(held.shape, candidates.keep, dtype=torch.long)
        return torch.where(held < candidates.keep + self.buffer, held, candidates.keep)

    def score(self, candidates: Candidates) -> torch.Tensor:
        lm, at = candidates.session.lm, candidates.at
        if lm.attention.latent is not None:
            raise KvvizError("r_kv compares whole keys by cosine similarity; a latent-attention (MLA) cache holds "
                             "one latent per token, which R-KV does not define")
        scores = torch.full((lm.layers, lm.kv_heads, at), float("-inf"))
        for layer, order in enumerate(self._orders(candidates)):
            window = min(self.window, at, order.shape[-1])
            keys = candidates.keys(layer).float().gather(1, order[..., None].expand(-1, -1, lm.head_dim))  # (KV, m, D)
            queries = candidates.queries(layer, slice(at - window, at)).float()  # (H, w, D)
            final = rkv_scores(queries, keys, window, self.kernel, self.mix, self.threshold, self.retain)
            scores[layer].scatter_(-1, order, torch.cat([final, torch.full_like(order[:, -window:], float("inf"),
                                                                                dtype=torch.float32)], -1))
        return scores

    def decide(self, candidates: Candidates) -> Decision:
        decision = super().decide(candidates)
        if candidates.scratch is None or self.order != "cache":
            return decision
        orders = []  # R-KV's cache after this decision: the kept in topk's order (by score), then the window
        for layer, order in enumerate(self._orders(candidates)):
            if not bool(decision.evicted[layer].gather(-1, order).any()):  # no compaction: the cache as it was
                orders.append(order)
                continue
            window = min(self.window, order.shape[-1])
            rest = order[:, : order.shape[-1] - window]
            by_score = decision.scores[layer].gather(-1, rest).argsort(dim=-1, descending=True, stable=True)
            ranked = rest.gather(-1, by_score)
            orders.append(torch.cat([_kept_in(ranked, ~decision.evicted[layer].gather(-1, ranked)),
                                     order[:, order.shape[-1] - window:]], -1))
        candidates.scratch["r_kv_order"] = orders
        return decision

    def _orders(self, candidates: Candidates) -> list[torch.Tensor]:
        """Per layer, the alive slots ``(KV, m)`` in the order R-KV's cache holds them: the previous decision's
        order (less what a sliding window hid since), then the slots cached since, in slot order; with
        ``order="slots"`` or one-shot, slot order."""
        alive = candidates.alive
        fresh = [_kept_in(torch.arange(candidates.at).expand(alive.shape[1], -1), alive[layer])
                 for layer in range(alive.shape[0])]
        before = (candidates.scratch or {}).get("r_kv_order") if self.order == "cache" else None
        if before is None:
            return fresh
        orders = []
        for layer, (old, new) in enumerate(zip(before, fresh)):
            old = _kept_in(old, alive[layer].gather(-1, old))
            newest = int(old.max()) if old.numel() else -1
            orders.append(torch.cat([old, _kept_in(new, new > newest)], -1))
        return orders


def _kept_in(ranked: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The kept entries of each row of ``ranked`` ``(KV, m)`` in their order (every row keeps as many)."""
    return torch.stack([row[mask] for row, mask in zip(ranked, kept)])


def rkv_scores(queries: torch.Tensor, keys: torch.Tensor, window: int, kernel: int, mix: float, threshold: float,
               retain: str) -> torch.Tensor:
    """R-KV's score of each key but the last ``window``: queries ``(H, w, D)`` (the window's, post-RoPE) and keys
    ``(KV, m, D)`` in the cache's order → ``(KV, m − window)``."""
    heads, rows, dim = queries.shape
    groups, m, _ = keys.shape
    logits = queries.view(groups, heads // groups, rows, dim) @ keys[:, None].transpose(-1, -2) / math.sqrt(dim)
    logits = logits.amax(1)  # (KV, w, m): the largest over a group's query heads
    importance = torch.softmax(logits[..., : m - window], dim=-1, dtype=torch.float32).mean(-2)  # (KV, m − w)
    importance = torch.nn.functional.max_pool1d(importance, kernel, stride=1, padding=kernel // 2)
    return importance * mix - redundancy(keys, threshold, retain)[:, : m - window] * (1 - mix)


def redundancy(keys: torch.Tensor, threshold: float = 0.5, retain: str = "last") -> torch.Tensor:
    """R-KV's redundancy of each key ``(KV, m, D)`` → ``(KV, m)``: cosine similarities (the diagonal 0), each row's
    most recent (``retain="last"``) or first similar key (above ``threshold``) forgiven, averaged over the rows,
    softmaxed over the keys."""
    m = keys.shape[1]
    unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-8)
    similarity = unit @ unit.transpose(-1, -2)
    similarity.masked_fill_(torch.eye(m, dtype=torch.bool), 0.0)
    indices = torch.where(similarity > threshold, torch.arange(m), torch.zeros((), dtype=torch.long))
    forgiven = indices.amax(-1) if retain == "last" else indices.amin(-1)
    similarity.scatter_(-1, forgiven[..., None], 0.0)
    return similarity.mean(-2).softmax(-1)
