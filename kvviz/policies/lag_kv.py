"""LagKV — Liang et al., "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important"
(2025, arXiv:2504.04704).

Attention-free. After ``sinks`` slots, the candidates are cut into partitions of ``lag`` slots; each partition is
scored against the next one (its "lag"): every key and value is min-max normalised per channel by the next
partition's range, the spread (standard deviation) over its channels is taken, and a softmax over the partition
turns the spreads into scores; keys' and values' scores are averaged. Without ``cross_scoring`` a slot's score is its
rank within its partition over ``lag``. The sinks and the tail (the last, incomplete partition and the one before
it, which has no lag) score 1 and stay. Fewer than ``sinks + 2·lag`` candidates: the sinks, then the rest by
recency. All as kvpress' ``LagKVPress`` computes it over a prompt; ``ties="topk"`` keeps among equal scores (many:
ranks repeat in every partition) what ``torch.topk`` keeps, as kvpress does. In a decode-mode run the partitions are
those of the slots still alive in each layer and KV head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, TopkTies, checked_choices


@dataclass(frozen=True)
class LagKV(TopkTies):
    name = "lag_kv"

    sinks: int = 4  # the first slots, always kept
    lag: int = 128  # slots per partition
    cross_scoring: bool = False  # keep the scores (True) instead of ranks within each partition

    def __post_init__(self) -> None:
        checked_choices(self)
        for name, least in (("sinks", 0), ("lag", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise KvvizError(f"lag_kv's {name} must be an integer ≥ {least}, got {value!r}")

    def score(self, candidates: Candidates) -> torch.Tensor:
        lm, at = candidates.session.lm, candidates.at
        scores = torch.full((lm.layers, lm.kv_heads, at), float("-inf"))
        for layer in range(lm.layers):
            keys, values = candidates.keys(layer).float(), candidates.values(layer).float()  # (KV, at, D)
            alive = candidates.alive[layer]
            if bool(alive.all()):
                scores[layer] = self._scores(keys, values).cpu()
                continue
            for head in range(lm.kv_heads):  # each KV head's alive slots, in order
                slots = alive[head].nonzero()[:, 0]
                scores[layer, head, slots] = self._scores(keys[head, slots][None], values[head, slots][None])[0].cpu()
        return scores

    def _scores(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Scores of ``n`` consecutive slots from their keys and values ``(KV, n, D)``: ``(KV, n)``."""
        heads, n, dim = keys.shape
        sinks, lag = self.sinks, self.lag
        if n < sinks + 2 * lag:  # too short to compress by partitions: the sinks, then by recency
            score = torch.ones(heads, n, dtype=keys.dtype, device=keys.device)
            if n > sinks:
                score[:, sinks:] = (torch.arange(n - sinks, device=keys.device) / (n - sinks)).to(keys.dtype)
            return score
        end = sinks + ((n - sinks) // lag) * lag
        parts = lambda x: x[:, sinks:end].reshape(heads, -1, lag, dim)  # noqa: E731  (KV, P, lag, D)
        score = (_spread(parts(keys)) + _spread(parts(values))) / 2  # (KV, P - 1, lag)
        if not self.cross_scoring:
            score = (score.argsort(dim=-1).argsort(dim=-1) / lag).to(keys.dtype)
        ones = lambda count: torch.ones(heads, count, dtype=score.dtype, device=score.device)  # noqa: E731
        return torch.cat((ones(sinks), score.reshape(heads, -1), ones(lag + n - end)), dim=-1)


def _spread(states: torch.Tensor) -> torch.Tensor:
    """Each partition but the last, scored by the next one: ``(KV, P, lag, D)`` → ``(KV, P − 1, lag)`` — the channels'
    min-max normalisation by the next partition's range, their standard deviation, a softmax over the partition."""
    reference, scored = states[:, 1:], states[:, :-1]
    low, high = reference.min(dim=-2, keepdim=True).values, reference.max(dim=-2, keepdim=True).values
    return ((scored - low) / (high - low)).std(dim=-1).softmax(dim=-1)
