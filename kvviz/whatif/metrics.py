"""Comparing two next-token distributions (docs/math.md §6): KL, total variation, top-k side by side with rank changes."""

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


def ranks_of(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rank (0 = most likely) of each token in ``ids`` under ``logits`` ``(V,)``; ties broken by token id, as
    ``argmax`` does: the number of tokens with a larger logit, or an equal logit and a smaller id.

    Only the tokens at least as likely as the least likely of ``ids`` can count, so they are picked out first (one
    pass over ``V``): the tokens of a top-k table rank near the top, which leaves a few candidates to compare."""
    mine = logits[ids]
    candidates = (logits >= mine.min()).nonzero()[:, 0]  # (C,) token ids
    values = logits[candidates][None, :]
    ranks = (values > mine[:, None]).sum(1, dtype=torch.int32)
    ranks += ((values == mine[:, None]) & (candidates[None, :] < ids[:, None])).sum(1, dtype=torch.int32)
    return ranks


EXPM1_LIMIT = 80.0  # float32 expm1 overflows past ~88: rows that far apart take the log-sum-exp form (no cancellation)


def kl_divergence(full: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(p_full ‖ p_other) in nats from logits: ``full`` ``(V,)`` against ``other`` ``(..., V)`` → ``(...)`` float64
    (exactly 0 for identical logits).

    In float32, without subtracting nearly equal numbers: with x = δ − m, δ = other − full and m ≈ Σ p·δ (taken out
    twice), KL = log Σ p·e^x − Σ p·x = log1p(Σ p·expm1(x)) − Σ p·x, whose terms are second order in x (the last one
    cancels what rounding left of m). The result carries a few float32 roundings of KL itself, not of the log-probabilities
    (~1e-6 absolute, which log_softmax(p) − log_softmax(q) in float32 would leave); float64 costs several times as
    much over a 49k-token vocabulary on a CPU, for nothing that shows."""
    a = full.float()
    w = torch.exp(a - a.max())  # (V,) p up to the factor 1/z
    z = w.sum()
    x = other.float() - a  # (..., V)
    for _ in range(2):
        x -= (x @ w / z).unsqueeze(-1)
    left = x @ w / z  # what rounding left of m: KL = log Σ p·e^x − Σ p·x holds for any constant taken out
    far = x.amax(-1) > EXPM1_LIMIT  # KL is large there: the log-sum-exp form loses nothing
    spread = torch.logsumexp(x + torch.log(w / z), -1) - left if bool(far.any()) else None
    kl = torch.log1p(torch.expm1(x.clamp_(max=EXPM1_LIMIT)) @ w / z) - left
    if spread is not None:
        kl = torch.where(far, spread, kl)
    return kl.double().clamp(min=0)


def compare(full_logits: torch.Tensor, edited_logits: torch.Tensor, k: int, text: Callable[[int], str]) -> NextToken:
    """Top-``k`` of both distributions side by side. ``text`` maps a token id to its piece. Ranks are counted on the
    logits as the model returned them (a float64 copy would order them the same)."""
    full_logits, edited_logits = full_logits.cpu(), edited_logits.cpu()
    p, q = torch.softmax(full_logits.float(), -1), torch.softmax(edited_logits.float(), -1)
    kl = float(kl_divergence(full_logits, edited_logits))  # KL(p‖q) in nats: exactly 0 for identical logits
    tv = float((p - q).abs().sum(dtype=torch.float64) / 2)
    tops = torch.cat([torch.topk(full_logits, k).indices, torch.topk(edited_logits, k).indices])  # then ordered by rank
    ranks = {"full": ranks_of(full_logits, tops).tolist(), "edited": ranks_of(edited_logits, tops).tolist()}
    probs = {"full": p[tops].tolist(), "edited": q[tops].tolist()}
    delta = (edited_logits[tops].double() - full_logits[tops].double()).tolist()
    ids = tops.tolist()

    def table(own: str, other: str, rows: range) -> list[Candidate]:
        return sorted((Candidate(ids[i], text(ids[i]), probs[own][i], ranks[own][i], ranks[other][i], delta[i])
                       for i in rows), key=lambda c: c.rank)

    return NextToken(full=table("full", "edited", range(k)), edited=table("edited", "full", range(k, 2 * k)), kl=kl,
                     tv=tv, top1_changed=int(full_logits.argmax()) != int(edited_logits.argmax()))
