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


def ranks_of(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rank (0 = most likely) of each token in ``ids`` under ``logits`` ``(V,)``; ties broken by token id, as
    ``argmax`` does: the number of tokens with a larger logit, or an equal logit and a smaller id."""
    mine = logits[ids][:, None]
    vocab = torch.arange(logits.numel(), device=logits.device)[None, :]
    return ((logits[None, :] > mine) | ((logits[None, :] == mine) & (vocab < ids[:, None]))).sum(1)


def compare(full_logits: torch.Tensor, edited_logits: torch.Tensor, k: int, text: Callable[[int], str]) -> NextToken:
    """Top-``k`` of both distributions side by side. ``text`` maps a token id to its piece."""
    full_logits, edited_logits = full_logits.double().cpu(), edited_logits.double().cpu()
    p, q = torch.softmax(full_logits, -1), torch.softmax(edited_logits, -1)

    def table(probs: torch.Tensor, own: torch.Tensor, other: torch.Tensor) -> list[Candidate]:
        top = torch.topk(own, k).indices  # then ordered exactly by rank (ties by id)
        rank_own, rank_other = ranks_of(own, top), ranks_of(other, top)
        order = torch.argsort(rank_own)
        return [Candidate(int(top[i]), text(int(top[i])), float(probs[top[i]]), int(rank_own[i]), int(rank_other[i]),
                          float(edited_logits[top[i]] - full_logits[top[i]])) for i in order]

    return NextToken(
        full=table(p, full_logits, edited_logits), edited=table(q, edited_logits, full_logits),
        kl=kl_divergence(full_logits, edited_logits), tv=total_variation(full_logits, edited_logits),
        top1_changed=int(full_logits.argmax()) != int(edited_logits.argmax()),
    )
