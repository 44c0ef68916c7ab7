"""The shared base of eviction policies: a policy scores the candidate slots, the base keeps the best of them.

A policy is a frozen dataclass whose fields are its parameters and whose one required method, :meth:`Policy.score`,
receives :class:`Candidates` — the keys, values, queries and attention it may use, like kvpress' ``ScorerPress.score``
— and returns keep-scores ``(L | 1, KV | 1, at)`` (a size-1 axis decides for all layers / KV heads at once; higher is
kept). :meth:`Policy.budgets` may share the budget unevenly between layers or KV heads (PyramidKV, AdaKV). The same
policy serves a one-shot mask at one step (:meth:`Policy.edit`) and a policy run (kvviz/runs), where it decides again
and again on the already compressed cache: slots evicted earlier are not candidates any more.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import ClassVar

import torch

from kvviz.edit.edit import Edit
from kvviz.errors import USER_CODE_ERRORS, KvvizError, failure
from kvviz.numbers import number
from kvviz.policies.candidates import Candidates, received_attention  # noqa: F401 (kvviz.policies.base's names)
from kvviz.policies.decision import Decision
from kvviz.session import Session


class Ratio(float):
    """kvpress' ``compression_ratio``: the fraction of the candidates *removed*. As a float it is the fraction kept,
    ``1 − ratio`` (so it stands wherever a fractional budget does); :func:`slots_kept` rounds it as kvpress does,
    ``max(1, int(n·(1 − ratio)))``, where a plain fraction keeps ``round(fraction·n)``."""

    def __new__(cls, ratio: float) -> Ratio:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            raise KvvizError(f"a compression ratio must be in [0, 1), got {ratio!r}")
        kept = super().__new__(cls, 1 - ratio)
        kept.ratio = float(ratio)
        return kept

    def __repr__(self) -> str:
        return f"ratio {self.ratio:g}"

    __str__ = __repr__

    def __reduce__(self):
        return Ratio, (self.ratio,)


def slots_kept(budget: int | float, at: int) -> int:
    """``budget`` as a number of slots: an int is a count, a float in (0, 1] a fraction of the ``at`` candidates
    (a :class:`Ratio` rounded as kvpress rounds)."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise KvvizError(f"budget must be a number of slots or a fraction, got {budget!r}")
    if isinstance(budget, Ratio):
        return min(max(1, int(at * float(budget))), at)
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise KvvizError(f"a fractional budget must be in (0, 1], got {budget}")
        return round(budget * at)
    if budget < 0:
        raise KvvizError(f"budget must be non-negative, got {budget}")
    return min(budget, at)


def kept_share(budget: int | float) -> float | None:
    """The share of the candidates a fractional budget keeps (a :class:`Ratio` as it is: a float that still knows
    its ``ratio``); None for a slot count."""
    return budget if isinstance(budget, Ratio) else float(budget) if isinstance(budget, float) else None


@dataclass(frozen=True)
class Policy:
    """Base class. Subclasses are frozen dataclasses whose fields are the policy's parameters (validated in
    ``__post_init__``); they set ``name`` and implement :meth:`score`."""

    name: ClassVar[str] = ""
    uniform: ClassVar[bool] = False  # keeps the same slots in every layer and KV head (re-rotated runs need it)
    accumulates: ClassVar[bool] = False  # reads ``accumulated()``: a run keeps it up to date step by step
    reads_hidden: ClassVar[bool] = False  # reads ``hidden_states()``: a run records them

    @property
    def decides_count(self) -> bool:
        """Whether the policy decides how many slots it keeps (an adaptive kvpress press: DMS' threshold): a run
        asks it at every decision, whatever the budget."""
        return False

    def settings(self) -> dict[str, int | float]:
        """The parameters, by field name (JSON-ready: saved with a session, shown as widgets)."""
        return asdict(self)

    def score(self, candidates: Candidates) -> torch.Tensor:
        """Keep-scores of the candidates: ``(L | 1, KV | 1, at)``, higher is kept."""
        raise NotImplementedError

    def protected(self, at: int, keep: int) -> int:
        """How many of ``at`` candidates this policy keeps whatever their scores (scored ``+inf``: its recent window,
        sinks) at a decision that keeps ``keep``; where that is ``keep`` or more, the decision keeps those alone."""
        return 0

    def extra_tokens(self, session: Session, at: int) -> int:
        """Tokens this policy feeds through the model, beyond the conversation's own, to decide once over the
        slots ``0..at-1`` (KVzip's reconstruction passes); 0 for policies that only read the cache and the records."""
        return 0

    def budgets(self, candidates: Candidates, scores: torch.Tensor) -> torch.Tensor:
        """Slots kept per layer and KV head, ``(L, KV)`` integers, from the scores ``(L, KV, at)`` (``-inf`` where
        not alive); the default keeps ``candidates.keep`` everywhere."""
        return torch.full(scores.shape[:2], candidates.keep, dtype=torch.long)

    def decide(self, candidates: Candidates) -> Decision:
        """Which candidates this policy evicts now, with the scores and budgets that decided it (see
        :class:`~kvviz.policies.decision.Decision`). Only alive slots are evicted. Ties keep the earlier slot,
        except among protected slots (score ``+inf``, see :func:`protect`): a budget smaller than the protected
        window keeps its most recent slots."""
        alive = candidates.alive
        lowest = torch.finfo(torch.float32).min  # alive slots always rank before evicted ones, even at -inf
        scores = torch.where(alive, checked_scores(self, candidates).clamp(min=lowest), float("-inf"))
        budgets = checked_budgets(self, candidates, scores).clamp(min=1)
        rank = keep_rank(scores)
        return Decision(candidates.at, scores, budgets, alive, alive & (rank >= budgets[..., None]), rank)

    def evicted(self, candidates: Candidates) -> torch.Tensor:
        """The candidates this policy evicts now: bool ``(L, KV, at)`` (:meth:`decide`'s)."""
        return self.decide(candidates).evicted

    def decision(self, session: Session, budget: int | float, at: int | None = None) -> Decision:
        """One-shot: the decision to keep the ``budget`` best-scored slots before ``at`` (default: the newest cached
        slot); with a budget that holds them all, nothing is evicted."""
        at = len(session) - 1 if at is None else at
        if not 0 <= at < len(session):
            raise KvvizError(f"slot {at} is not cached")
        keep = slots_kept(budget, at)
        if keep == 0:
            raise KvvizError("the budget keeps no slot; keep at least one")
        lm = session.lm  # a sliding-window layer no longer holds the slots its window left behind
        alive = ~lm.attention.outside(at, at)[:, None].expand(lm.layers, lm.kv_heads, at)
        return self.decide(Candidates(session, at, min(keep, at), alive, share=kept_share(budget)))

    def edit(self, session: Session, budget: int | float, at: int | None = None) -> Edit:
        """One-shot: evict all but the ``budget`` best-scored slots before ``at`` (default: the newest cached slot)."""
        at = len(session) - 1 if at is None else at
        if 0 <= at < len(session) and slots_kept(budget, at) >= at and not self.decides_count:
            return Edit()
        return Edit.from_evicted(self.decision(session, budget, at).evicted)


def topk_ties(decision: Decision, keep: int) -> Decision:
    """``decision`` with the slots ``torch.topk`` keeps among the same scores (kvpress' ``ScorerPress`` keeps
    ``scores.topk(n_kept)``, whose choice among equal scores is its own): the kept ones rank first, each group in
    :func:`keep_rank`'s order."""
    kept = torch.topk(decision.scores, min(keep, decision.at), dim=-1).indices
    evicted = decision.alive & ~torch.zeros_like(decision.alive).scatter_(-1, kept, True)
    order = decision.rank + decision.at * evicted  # kept first
    return replace(decision, evicted=evicted, rank=order.argsort(-1).argsort(-1))


@dataclass(frozen=True)
class TopkTies(Policy):
    """A policy that can keep, among equal scores, what ``torch.topk`` keeps (``ties="topk"``: kvpress'
    ``ScorerPress`` keeps ``scores.topk(n_kept)``) instead of the earlier slot."""

    ties: str = field(default="earlier", metadata={"choices": ("earlier", "topk")})

    def __post_init__(self) -> None:
        checked_choices(self)

    def decide(self, candidates: Candidates) -> Decision:
        decision = super().decide(candidates)
        return decision if self.ties == "earlier" else topk_ties(decision, candidates.keep)


def checked_scores(policy: Policy, candidates: Candidates) -> torch.Tensor:
    """``policy.score`` as float32 ``(L, KV, at)`` on the CPU; a policy that fails or returns another shape is
    refused with one line naming it."""
    lm = candidates.session.lm
    try:
        scores = policy.score(candidates)
    except KvvizError:
        raise
    except USER_CODE_ERRORS as exc:
        raise KvvizError(f"policy {policy.name or type(policy).__name__} failed: {failure(exc)}") from exc
    shape = (lm.layers, lm.kv_heads, candidates.at)
    if not isinstance(scores, torch.Tensor) or scores.dim() != 3 or any(
            size not in (1, full) for size, full in zip(scores.shape, shape)) or scores.shape[-1] != shape[-1]:
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise KvvizError(f"policy {policy.name or type(policy).__name__} returned scores of shape {got}; "
                         f"expected (L | 1, KV | 1, at) = ({shape[0]} | 1, {shape[1]} | 1, {shape[2]})")
    scores = scores.float().cpu().expand(shape)
    if bool(scores.isnan().any()):
        raise KvvizError(f"policy {policy.name or type(policy).__name__} returned NaN scores; score every slot")
    return scores


def checked_budgets(policy: Policy, candidates: Candidates, scores: torch.Tensor) -> torch.Tensor:
    """``policy.budgets`` as integers ``(L, KV)``; a failure or another shape is refused with one line."""
    name = policy.name or type(policy).__name__
    try:
        budgets = policy.budgets(candidates, scores)
    except KvvizError:
        raise
    except USER_CODE_ERRORS as exc:
        raise KvvizError(f"policy {name}'s budgets failed: {failure(exc)}") from exc
    if not isinstance(budgets, torch.Tensor) or tuple(budgets.shape) != tuple(scores.shape[:2]) \
            or budgets.is_floating_point() or budgets.is_complex():
        got = tuple(budgets.shape) if isinstance(budgets, torch.Tensor) else type(budgets).__name__
        raise KvvizError(f"policy {name}'s budgets must be integers of shape (L, KV) = {tuple(scores.shape[:2])}, "
                         f"got {got}")
    return budgets.long().cpu()


def keep_rank(scores: torch.Tensor) -> torch.Tensor:
    """Each slot's rank in the order of keeping, 0 first: ``(..., at)`` from scores ``(..., at)``. Higher scores
    first; ties go to the earlier slot, among ``+inf`` (protected) ones to the later slot."""
    positions = torch.arange(scores.shape[-1])
    by_tie = torch.argsort(torch.where(scores == float("inf"), -positions, positions).expand_as(scores), dim=-1,
                           stable=True)
    order = by_tie.gather(-1, torch.argsort(scores.gather(-1, by_tie), dim=-1, descending=True, stable=True))
    return torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))


def protect(scores: torch.Tensor, slots: slice) -> torch.Tensor:
    """Scores with ``slots`` (a recent window) always kept: ``+inf``, the most recent first where a budget cannot
    hold them all (:func:`keep_rank`)."""
    scores = scores.clone()
    scores[..., slots] = float("inf")
    return scores


def choice(default: str, *others: str):
    """A text parameter that takes one of ``default, *others`` (the app shows them as a menu)."""
    return field(default=default, metadata={"choices": (default, *others)})


def checked_choices(policy: Policy) -> None:
    """Refuse a text parameter of ``policy`` outside its choices."""
    for item in fields(policy):
        allowed = item.metadata.get("choices")
        if allowed and getattr(policy, item.name) not in allowed:
            raise KvvizError(f"{policy.name}'s {item.name} must be one of {', '.join(allowed)}, "
                             f"got {getattr(policy, item.name)!r}")


def positive(policy: Policy, *names: str) -> None:
    """Refuse parameters ``names`` of ``policy`` that are not positive numbers."""
    for name in names:
        number(getattr(policy, name), f"{policy.name}'s {name}", 0, above=True)
