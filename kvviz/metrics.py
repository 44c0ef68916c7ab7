"""Comparing two next-token distributions (seed §11): KL, total variation, top-k side by side with rank changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Candidate:
    """One row of a top-k table: the token, its probability, its rank here and in the other distribution."""

    id: int
    text: str
    prob: float
    rank: int
    rank_other: int
    logit_delta: float  # edited logit − full logit


@dataclass(frozen=True)
class NextToken:
    full: list[Candidate]
    edited: list[Candidate]
    kl: float  # KL(p_full ‖ p_edited), nats
    tv: float  # ½ Σ |p_full − p_edited|
    top1_changed: bool

    def to_dict(self) -> dict:
        row = lambda c: {"id": c.id, "text": c.text, "prob": c.prob, "rank": c.rank,  # noqa: E731
                         "rank_other": c.rank_other, "logit_delta": c.logit_delta}
        return {"full": [row(c) for c in self.full], "edited": [row(c) for c in self.edited],
                "kl": self.kl, "tv": self.tv, "top1_changed": self.top1_changed}


def kl_divergence(full_logits: torch.Tensor, edited_logits: torch.Tensor) -> float:
    """``KL(p‖q) = Σ p (log p − log q)`` in float64 from logits ``(V,)``; exactly 0 for identical logits."""
    log_p = torch.log_softmax(full_logits.double(), -1)
    log_q = torch.log_softmax(edited_logits.double(), -1)
    return float((log_p.exp() * (log_p - log_q)).sum().clamp_min(0))


def total_variation(full_logits: torch.Tensor, edited_logits: torch.Tensor) -> float:
    p = torch.softmax(full_logits.double(), -1)
    q = torch.softmax(edited_logits.double(), -1)
    return float((p - q).abs().sum() / 2)


def ranks(logits: torch.Tensor) -> torch.Tensor:
    """Rank of every token (0 = most likely) ``(V,)``; ties broken by token id, as ``argmax`` does."""
    order = torch.argsort(-logits.double(), stable=True)
    result = torch.empty_like(order)
    result[order] = torch.arange(order.numel(), device=order.device)
    return result


def compare(full_logits: torch.Tensor, edited_logits: torch.Tensor, k: int, text: Callable[[int], str]) -> NextToken:
    """Top-``k`` of both distributions side by side. ``text`` maps a token id to its piece."""
    full_logits, edited_logits = full_logits.double().cpu(), edited_logits.double().cpu()
    p, q = torch.softmax(full_logits, -1), torch.softmax(edited_logits, -1)
    rank_p, rank_q = ranks(full_logits), ranks(edited_logits)

    def table(probs: torch.Tensor, own: torch.Tensor, other: torch.Tensor) -> list[Candidate]:
        top = torch.argsort(own)[:k]  # the ids of ranks 0..k-1
        return [Candidate(int(i), text(int(i)), float(probs[i]), int(own[i]), int(other[i]),
                          float(edited_logits[i] - full_logits[i])) for i in top]

    return NextToken(
        full=table(p, rank_p, rank_q), edited=table(q, rank_q, rank_p),
        kl=kl_divergence(full_logits, edited_logits), tv=total_variation(full_logits, edited_logits),
        top1_changed=bool(rank_p.argmin() != rank_q.argmin()),
    )
