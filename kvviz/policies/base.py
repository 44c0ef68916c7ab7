"""The shared base of eviction policies: a policy scores the cached slots, the base keeps the best ``budget``.

Scores are ``(L | 1, KV | 1, at)`` — a size-1 axis means the policy decides for all layers / KV heads at once.
Higher scores are kept. Only the slots before ``at`` (the step being re-run) are candidates, so no policy can evict
the token being processed. The result is an :class:`~kvviz.edits.Edit` the person can change by hand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from kvviz.edits import Edit, Eviction
from kvviz.errors import KvvizError
from kvviz.session import Session


def slots_kept(budget: int | float, at: int) -> int:
    """``budget`` as a number of slots: an int is a count, a float in (0, 1] a fraction of the ``at`` candidates."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise KvvizError(f"budget must be a number of slots or a fraction, got {budget!r}")
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise KvvizError(f"a fractional budget must be in (0, 1], got {budget}")
        return round(budget * at)
    if budget < 0:
        raise KvvizError(f"budget must be non-negative, got {budget}")
    return min(budget, at)


@dataclass(frozen=True)
class Policy:
    """Base class. Subclasses are frozen dataclasses whose fields are the policy's parameters (validated in
    ``__post_init__``); they set ``name`` and implement :meth:`scores`."""

    name: ClassVar[str] = ""

    def settings(self) -> dict[str, int | float]:
        """The parameters, by field name (JSON-ready: saved with a session, shown as widgets)."""
        return asdict(self)

    def scores(self, session: Session, at: int, keep: int) -> torch.Tensor:
        """Keep-scores of slots ``0..at-1``: ``(L | 1, KV | 1, at)``; ``keep`` is the number of slots kept."""
        raise NotImplementedError

    def edit(self, session: Session, budget: int | float, at: int | None = None) -> Edit:
        """Evict all but the ``budget`` best-scored slots before ``at`` (default: the newest cached slot)."""
        at = len(session) - 1 if at is None else at
        if not 0 <= at < len(session):
            raise KvvizError(f"slot {at} is not cached")
        keep = slots_kept(budget, at)
        if keep >= at:
            return Edit()
        if keep == 0:
            raise KvvizError("the budget keeps no slot; keep at least one")
        scores = self.scores(session, at, keep).float()
        layers, heads, _ = scores.shape
        order = torch.argsort(scores, dim=-1, descending=True, stable=True)  # ties: the earlier slot is kept
        evictions = []
        for layer in range(layers):
            for head in range(heads):
                evicted = sorted(order[layer, head, keep:].tolist())
                evictions.append(Eviction(tuple(evicted), None if layers == 1 else (layer,),
                                          None if heads == 1 else (head,)))
        return Edit(evictions=tuple(evictions))


def protect(scores: torch.Tensor, slots: slice) -> torch.Tensor:
    """Scores with ``slots`` (e.g. a recent window) always kept."""
    scores = scores.clone()
    scores[..., slots] = float("inf")
    return scores


def received_attention(session: Session, at: int, rows: slice, chunk: int = 256) -> torch.Tensor:
    """Attention each slot ``0..at-1`` received from the query slots ``rows`` (all before ``at``), summed over those
    queries and over the query heads of each KV group: ``(L, KV, at)``."""
    lm = session.lm
    start, stop = rows.start, rows.stop
    total = torch.zeros(lm.layers, lm.heads, at)
    for layer in range(lm.layers):
        for first in range(start, stop, chunk):
            weights = session.weights(layer, first, min(stop, first + chunk))  # (H, rows, ≤ at)
            total[layer, :, : weights.shape[-1]] += weights.sum(1).cpu()
    return total.reshape(lm.layers, lm.kv_heads, lm.heads // lm.kv_heads, at).sum(2)


def positive(policy: Policy, *names: str) -> None:
    """Refuse parameters ``names`` of ``policy`` that are not positive numbers."""
    for name in names:
        value = getattr(policy, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise KvvizError(f"{policy.name}'s {name} must be a positive number, got {value!r}")
