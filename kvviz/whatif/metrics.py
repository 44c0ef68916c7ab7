"""Comparing two next-token distributions (docs/math.md §6): KL, total variation, top-k side by side with rank changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

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
    """Rank (0 = most likely) of each token in ``ids`` ``(m,)`` under ``logits`` ``(V,)`` → ``(m,)``, or under each row
    of ``logits`` ``(R, V)`` → ``(R, m)``; ties broken by token id, as ``argmax`` does: the number of tokens with a
    larger logit, or an equal logit and a smaller id.

    Only the tokens at least as likely as the least likely of ``ids`` can count, so they are picked out first (one
    pass over ``V``): the tokens of a top-k table rank near the top, which leaves a few candidates to compare."""
    mine = logits[..., ids]  # (..., m)
    above = logits >= mine.amin(-1, keepdim=True)
    candidates = (above if logits.dim() == 1 else above.any(0)).nonzero()[:, 0]  # (C,) token ids
    values = logits[..., candidates].unsqueeze(-2)  # (..., 1, C)
    mine = mine.unsqueeze(-1)  # (..., m, 1)
    ranks = (values > mine).sum(-1, dtype=torch.int32)
    ranks += ((values == mine) & (candidates < ids[:, None])).sum(-1, dtype=torch.int32)
    return ranks


EXPM1_LIMIT = 80.0  # float32 expm1 overflows past ~88: rows that far apart take the log-sum-exp form (no cancellation)


def probabilities(logits: torch.Tensor) -> torch.Tensor:
    """softmax of float32 ``logits`` ``(..., V)`` → float32 ``(..., V)``, normalized by a float64 sum: every entry
    carries a few roundings of its own (the exponent's, exp's, the quotient's), none that depends on the order in which
    a CPU's kernels add the vocabulary up. Both sides of a comparison use it, so identical logits give identical
    probabilities."""
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))
    return (weights / weights.sum(-1, keepdim=True, dtype=torch.float64)).float()


class Reference:
    """A next-token distribution others are compared to: ``logits`` ``(V,)``, with what every comparison reads of it
    (its float32 probabilities, its top tokens) computed once. The what-if keeps one per full run, so a click compares
    only the edited side."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits.cpu().float()  # (V,) float32: exact for bfloat16 / float16 logits, ordered alike
        self.p = probabilities(self.logits)  # (V,) float32, as the edited side's are computed
        self.p64 = self.p.double()  # (V,) the same values: float32 × float32 products are exact in float64
        self._tops: dict[int, torch.Tensor] = {}

    def top(self, k: int) -> torch.Tensor:
        """The ``k`` most likely token ids ``(k,)``."""
        if k not in self._tops:
            self._tops[k] = torch.topk(self.logits, k).indices
        return self._tops[k]

    @cached_property
    def top1(self) -> torch.Tensor:
        """``(1,)``: the most likely token, the lowest id among ties (as ``argmax`` picks it)."""
        return self.logits.argmax()[None]

    def kl(self, other: torch.Tensor) -> torch.Tensor:
        """KL(p ‖ p_other) in nats from ``other``'s logits ``(..., V)`` → ``(...)`` float64 (exactly 0 for identical
        logits).

        Without subtracting nearly equal numbers: with x = δ − m, δ = other − logits and m ≈ Σ p·δ (taken out twice,
        in float32), KL = log Σ p·e^x − Σ p·x = log1p(Σ p·expm1(x)) − Σ p·x, whose terms are second order in x (the
        last one cancels what rounding left of m). x and expm1(x) are float32; the two sums over the vocabulary add
        their exact float64 products in float64, so no CPU's summation order shows in the result: what is left is a
        few float32 roundings of each logit, expm1's own and the probabilities' (docs/tests.md, "KL"). A float32
        log_softmax(p) − log_softmax(q) would leave ~1e-6 absolute, whatever KL is."""
        x = other.float() - self.logits  # (..., V)
        for _ in range(2):
            x -= (x @ self.p) if x.dim() == 1 else (x @ self.p).unsqueeze(-1)
        left = x.double() @ self.p64  # what rounding left of m: KL = log Σ p·e^x − Σ p·x holds for any constant
        far = x.amax(-1) > EXPM1_LIMIT  # KL is large there: the log-sum-exp form loses nothing
        spread = (torch.logsumexp(x.double() + torch.log(self.p64), -1) - left
                  if bool(far if x.dim() == 1 else far.any()) else None)
        kl = torch.log1p(torch.expm1(x.clamp_(max=EXPM1_LIMIT)).double() @ self.p64) - left
        if spread is not None:
            kl = torch.where(far, spread, kl)
        return kl.clamp(min=0)


def kl_divergence(full: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(p_full ‖ p_other) in nats from logits: ``full`` ``(V,)`` against ``other`` ``(..., V)`` → ``(...)`` float64;
    see :meth:`Reference.kl`."""
    return Reference(full).kl(other)


def compare(full: torch.Tensor | Reference, edited_logits: torch.Tensor, k: int,
            text: Callable[[int], str]) -> NextToken:
    """Top-``k`` of both distributions side by side: ``full`` logits ``(V,)`` (or their :class:`Reference`) and
    ``edited_logits`` ``(V,)``. ``text`` maps a token id to its piece. Ranks are counted on the logits in float32 (exact
    for the model's dtypes; a float64 copy would order them the same)."""
    reference = full if isinstance(full, Reference) else Reference(full)
    edited = edited_logits.cpu().float()
    q = probabilities(edited)
    kl = reference.kl(edited)  # KL(p‖q) in nats: exactly 0 for identical logits
    tv = (reference.p - q).abs().sum(dtype=torch.float64)  # twice the total variation
    # the full run's top k, the edited run's, then the full run's top-1 (whose edited rank says if the top-1 changed)
    tops = torch.cat([reference.top(k), torch.topk(edited, k).indices, reference.top1])
    both = torch.stack([reference.logits, edited])  # (2, V)
    ranks = dict(zip(("full", "edited"), ranks_of(both, tops).tolist()))  # (2k + 1,) each
    probs = {"full": reference.p[tops].tolist(), "edited": q[tops].tolist()}
    full_logits, edited_logits = both[:, tops].tolist()
    delta = [e - f for e, f in zip(edited_logits, full_logits)]  # float64, as Python subtracts them
    ids = tops.tolist()

    def table(own: str, other: str, rows: range) -> list[Candidate]:
        return sorted((Candidate(ids[i], text(ids[i]), probs[own][i], ranks[own][i], ranks[other][i], delta[i])
                       for i in rows), key=lambda c: c.rank)

    kl, tv = torch.stack([kl, tv]).tolist()
    return NextToken(full=table("full", "edited", range(k)), edited=table("edited", "full", range(k, 2 * k)), kl=kl,
                     tv=tv / 2, top1_changed=ranks["edited"][2 * k] != 0)
