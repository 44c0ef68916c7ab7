"""RocketKV — Behnam et al., "RocketKV: Accelerating Long-Context LLM Inference via Two-Stage KV Cache Compression"
(ICML 2025); reference code: NVlabs/RocketKV, ``pipeline/inf_stream_llm/inf_llm/attention/rocket.py`` (its
``rocket_forward``) and ``pipeline/inf_stream_llm/infllm_utils.py`` (its budgets); TensorRT-LLM runs the same two
stages (``sparse/rocket.py``).

Stage 1, after the prompt: SnapKV — the attention the last ``window`` prompt queries pay each earlier slot, summed over
the window's rows and a KV group's heads, max-pooled over ``kernel`` neighbours, the top ``budget − window`` kept with
the window (:class:`RocketKV`, kvviz's :class:`~kvviz.policies.snapkv.SnapKV` with RocketKV's defaults: window 32,
kernel 63, the whole window kept). Stage 2, at every decode step: *hybrid sparse attention* picks the ``topk`` slots
(per KV head) the step reads among those kept, from an approximation of its attention (:class:`HybridSparse`):

- the query's sign per channel (summed over the group's heads) turns keys and queries so the query is positive;
- the kept keys, in cache order, are cut into chunks of ``c = ⌈√ρ⌉`` slots (1 where ``c > ρ``), each chunk's
  channel-wise maximum standing for it (the sequence reduction; ρ = ``compression_ratio``);
- only the ``r = ⌊D·c/ρ⌋`` channels of largest mean ``|q|`` over the group are multiplied (the head-dim reduction);
- the approximate scores, softmaxed at the scale ``√(D·Σ|q̂|/Σ|q|)`` and averaged over the group, rank the slots; the
  step reads the ``min(topk, n)`` best, exactly.

In kvviz the second stage is a run's *reader* that decides inside the step's pass, with the step's own query
(``RunSettings(reader=HybridSparse(ρ), reads=topk)``; :func:`kvviz.runs.from_names.from_names` sets it for
``rocket_kv``). :func:`budgets` is how RocketKV's pipeline derives the prompt budget, ``topk`` and ρ from its one token
budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, positive
from kvviz.policies.decision import Decision
from kvviz.policies.snapkv import SnapKV


@dataclass(frozen=True)
class RocketKV(SnapKV):
    """Stage 1 (the prompt's compression to the run's budget), carrying stage 2's parameters: each decode step reads
    ``topk`` slots chosen by :class:`HybridSparse` at ``compression_ratio``."""

    name = "rocket_kv"

    window: int = 32
    kernel: int = 63
    window_kept: str = "all"
    topk: int = 16  # slots each decode step reads, per KV head (RocketKV: token_budget // 2)
    compression_ratio: float = 4.0  # ρ of the second stage's approximation

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "topk")
        if not math.isfinite(self.compression_ratio) or self.compression_ratio < 1:
            raise KvvizError(f"rocket_kv's compression_ratio must be at least 1, got {self.compression_ratio}")

    def decide(self, candidates: Candidates) -> Decision:
        """SnapKV's decision, with RocketKV's choice among equal pooled scores (max pooling makes plateaus): the
        window, and ``torch.topk`` of the scores before it for the rest of the budget, as its code keeps them."""
        decision = super().decide(candidates)
        at, keep = decision.at, candidates.keep
        window = self.protected(at, keep)
        if keep <= window or not bool(decision.alive.all()):  # the window alone, or a later turn: SnapKV's choice
            return decision
        kept = decision.scores[..., : at - window].topk(min(keep - window, at - window), dim=-1).indices
        mask = torch.zeros_like(decision.alive).scatter_(-1, kept, True)
        mask[..., at - window:] = True
        evicted = decision.alive & ~mask
        order = decision.rank + at * evicted  # kept first
        return replace(decision, evicted=evicted, rank=order.argsort(-1).argsort(-1))

    @property
    def reader(self) -> HybridSparse:
        """Stage 2: the per-step selection."""
        return HybridSparse(self.compression_ratio)


@dataclass(frozen=True)
class HybridSparse:
    """RocketKV's hybrid sparse attention as a query-aware reader: picks, inside a decode step's pass, the slots the
    step reads (:meth:`pick`)."""

    compression_ratio: float = 4.0
    name = "hybrid_sparse"

    def __post_init__(self) -> None:
        if not math.isfinite(self.compression_ratio) or self.compression_ratio < 1:
            raise KvvizError(f"the compression ratio must be at least 1, got {self.compression_ratio}")

    def settings(self) -> dict:
        return {"compression_ratio": self.compression_ratio}

    def pick(self, query: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, topk: int) -> torch.Tensor:
        """The slots one decode step reads: bool ``(KV, n)`` among ``allowed`` ``(KV, n)`` (each KV head the same
        count of them, as RocketKV's compacted cache holds), from its query ``(KV, G, D)`` (the G query heads of
        each KV head, post-RoPE) and the cached keys ``(KV, n, D)``."""
        kv, n = allowed.shape
        count = int(allowed[0].sum())
        if not bool((allowed.sum(-1) == count).all()):
            raise KvvizError("hybrid sparse attention needs as many kept slots in every KV head of a layer")
        slots = allowed.nonzero()[:, 1].view(kv, count)  # (KV, m): the kept slots in cache order
        kept = keys.gather(1, slots[..., None].expand(-1, -1, keys.shape[-1]))
        chosen = approximate_top(query[None, :, :, None], kept[None, :, None], topk, self.compression_ratio)
        return torch.zeros_like(allowed).scatter_(1, slots.gather(1, chosen[0, :, 0, 0]), True)


def approximate_top(query: torch.Tensor, keys: torch.Tensor, topk: int, compression_ratio: float) -> torch.Tensor:
    """RocketKV's hybrid sparse attention, its selection: query ``(B, KV, G, 1, D)``, keys ``(B, KV, 1, m, D)`` (one
    decode step over ``m`` cached slots, all visible) → the indices ``(B, KV, 1, 1, min(topk, m))`` of the slots it
    reads, by approximate score (the layout of RocketKV's code)."""
    batch, heads, _, m, dim = keys.shape
    sign = torch.where(query.sum(dim=2, keepdim=True) > 0, 1.0, -1.0).to(query.dtype)
    max_key, positive_query = keys * sign, query * sign
    chunk = math.ceil(math.sqrt(compression_ratio))
    chunk = chunk if chunk <= compression_ratio else 1
    pad = chunk - ((m - 1) % chunk + 1)
    max_key = torch.cat([max_key, max_key.new_full((batch, heads, 1, pad, dim), torch.finfo(max_key.dtype).min)], -2)
    chunk_max = max_key.view(batch, heads, 1, (m + pad) // chunk, chunk, dim).amax(dim=-2)
    r = int(dim * chunk / compression_ratio)
    magnitude = query.abs()
    channels = torch.topk(magnitude.mean(dim=2, keepdim=True), r, dim=-1).indices  # (B, KV, 1, 1, r)
    q_hat = positive_query.gather(-1, channels.expand(*positive_query.shape[:-1], r))
    k_hat = chunk_max.gather(-1, channels.expand(*chunk_max.shape[:-1], r))
    scores = (q_hat @ k_hat.transpose(-1, -2)).repeat_interleave(chunk, dim=-1)[..., :m]  # (B, KV, G, 1, m)
    scale = torch.sqrt(dim * q_hat.abs().sum(dim=-1, keepdim=True) / magnitude.sum(dim=-1, keepdim=True))
    approximate = torch.softmax(scores / scale, dim=-1)
    return torch.topk(approximate.mean(dim=2, keepdim=True), min(topk, m), dim=-1).indices


def budgets(token_budget: int, sequence: int, new_tokens: int) -> tuple[int, int, float]:
    """RocketKV's pipeline (``infllm_utils.compress``): from its token budget, a sequence of ``sequence`` tokens
    (prompt and new ones) and ``new_tokens`` to generate → the prompt budget (stage 1), ``topk`` and the compression
    ratio (stage 2)."""
    if token_budget < 16:
        raise KvvizError(f"RocketKV's token budget is at least 16, got {token_budget}")
    ratio = max(1.0, sequence / token_budget)
    exponent = min(0.2 + math.log2(ratio) * 0.06, 0.8)
    capacity = max(int(sequence / ratio**exponent), min(2 * new_tokens, sequence))
    return capacity - new_tokens, token_budget // 2, max(1.0, capacity / token_budget)
