"""Expected attention — Devoto et al., "Expected Attention: KV Cache Compression by Estimating Attention from Future
Queries Distribution" (2025, arXiv:2510.00636), as kvpress' ``ExpectedAttentionPress`` computes it.

Per layer: the queries seen so far (after the first ``sinks``), before RoPE, give a mean ``μ`` and a covariance
``Σ`` per query head; RoPE averaged over the next ``future`` positions, ``R̄ = mean_p R(p)``, moves them to
``μ' = R̄μ`` and ``Σ' = R̄ΣR̄ᵀ``. For a Gaussian query, ``E[exp(q·k/√d)] = exp(μ'·k/√d + ½·kᵀΣ'k/d)``: those
exponents, a softmax over the candidates, averaged over the query heads of each KV group and multiplied by ``‖v‖``
(``vnorm``), score the slots; the first ``sinks`` slots are kept (scored one above the highest). kvviz records
post-RoPE queries; RoPE is a rotation, so the pre-RoPE ones are the recorded ones rotated back by their positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.numbers import number
from kvviz.policies.base import Candidates, TopkTies


@dataclass(frozen=True)
class ExpectedAttention(TopkTies):
    name = "expected_attention"

    future: int = 512  # future positions RoPE is averaged over
    sinks: int = 4  # the first slots: kept, and left out of the query statistics
    covariance: bool = True  # the ½·kᵀΣ'k/d term
    vnorm: bool = True  # scores times ‖v‖
    epsilon: float = 0.0  # added to the scores before the ‖v‖ rescaling

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("future", "sinks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "future" else 0):
                raise KvvizError(f"expected_attention's {name} must be a {'positive' if name == 'future' else 'non-negative'} "
                                 f"integer, got {value!r}")
        number(self.epsilon, "expected_attention's epsilon", 0)  # kvpress adds it to scores that are ≥ 0

    def score(self, candidates: Candidates) -> torch.Tensor:
        from kvviz.rope import Rotary  # RoPE's frequencies (a plain-RoPE model only)

        lm, at, sinks = candidates.session.lm, candidates.at, self.sinks
        if lm.attention.latent is not None:
            raise KvvizError("expected_attention turns whole keys by RoPE; a latent-attention (MLA) key carries RoPE "
                             "in its RoPE channels only, which this policy does not model yet")
        if at <= sinks + 1:
            raise KvvizError(f"expected_attention needs more than sinks + 1 = {sinks + 1} candidates")
        positions = torch.tensor([s.position for s in candidates.session.transcript.slots[:at]])
        groups = lm.heads // lm.kv_heads
        scores, rotations = [], []  # the averaged rotation, once per distinct RoPE (one, or one per layer type)
        for layer in range(lm.layers):
            rotary = Rotary.for_layer(lm, layer)
            rotation = next((r for freq, r in rotations if torch.equal(freq, rotary.inv_freq)), None)
            if rotation is None:
                rotation = _mean_rotation(rotary, at, self.future, lm.head_dim)  # (D, D)
                rotations.append((rotary.inv_freq, rotation))
            queries = candidates.queries(layer, slice(sinks, at)).float()  # (H, m, D) post-RoPE
            queries = rotary.rotate(queries, -positions[sinks:at].float()).cpu()  # back to before RoPE
            mean = queries.mean(1, keepdim=True)  # (H, 1, D)
            keys = candidates.keys(layer)[:, sinks:].float().cpu().repeat_interleave(groups, 0).transpose(1, 2)
            # (H, D, n); the operations below in kvpress' order, so that the same numbers round the same way
            exponent = torch.matmul(torch.matmul(mean[:, 0], rotation.T)[:, None], keys)[:, 0] / math.sqrt(lm.head_dim)
            if self.covariance:
                centred = queries - mean
                cov = torch.einsum("hsi,hsj->hij", centred, centred) / queries.shape[1]
                cov = torch.matmul(rotation, torch.matmul(cov, rotation.T))  # (H, D, D)
                exponent = exponent + torch.einsum("hin,hij,hjn->hn", keys, cov, keys) / lm.head_dim / 2
            alive = candidates.alive[layer, :, sinks:].repeat_interleave(groups, 0)
            weights = torch.where(alive, exponent, float("-inf")).softmax(-1)
            score = weights.view(lm.kv_heads, groups, -1).mean(1)  # (KV, n)
            if self.vnorm:
                score = (score + self.epsilon) * candidates.values(layer)[:, sinks:].float().cpu().norm(dim=-1)
            top = float(score.max()) + 1
            scores.append(torch.cat((torch.full((lm.kv_heads, sinks), top), score), dim=-1))
        return torch.stack(scores)  # (L, KV, at)


def _mean_rotation(rotary, start: int, count: int, dim: int) -> torch.Tensor:
    """RoPE's rotation averaged over the positions ``start..start+count-1``: ``mean_p (cos_p·I + sin_p·P)`` with
    ``P`` the ``rotate_half`` matrix, ``(D, D)``; with partial RoPE (Qwen3-Next) over the first ``2·len(θ)`` channels,
    the identity on the others."""
    freqs = torch.arange(start, start + count, dtype=torch.float32)[:, None] * rotary.inv_freq.cpu()  # (count, R/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # (count, R)
    rotated = emb.shape[-1]
    half = rotated // 2
    swap = torch.zeros(rotated, rotated)
    swap[half:, :half], swap[:half, half:] = torch.eye(half), -torch.eye(half)
    mean = torch.eye(dim)
    mean[:rotated, :rotated] = (cos[:, None] * torch.eye(rotated) + sin[:, None] * swap).mean(0)
    return mean
