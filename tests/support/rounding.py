"""Tolerances for comparing two float32 computations that differ only in the order of their sums — another thread
count (a reduction split differently), another batch shape (a matrix-vector kernel where the other side ran a
matrix-matrix one: a cached decode step against a no-cache forward, a chunked prefill, a batch of variants), another
process. Such results are not bitwise equal on every CPU; a tolerance fitted to one CPU fails on the next (a sweep
test once failed at rel 1.2e-5 against 1e-5). Each bound here is argued from float32 arithmetic instead.

**Logits.** The unit roundoff of float32 is u = 2⁻²⁴ ≈ 6.0e-8. In the probabilistic model of rounding errors
(Higham & Mary, "A new approach to probabilistic rounding error analysis", 2019) a length-K dot product carries an
error of about √K·u relative to its terms, and the errors of the matrix products along the residual stream add like a
random walk. A decoder of L layers runs 7 products per layer on that path (q, k, v, o, gate, up, down), each of inner
size at most K = max(hidden, intermediate), so two summation orders of logits of magnitude ≤ Z differ by about

    ε_z = √(K · 7L) · u · Z.

A latent-attention layer (MLA) runs 3 more (its query and key-value down- and up-projections in place of q, k, v, and
kvviz's absorbed score), some of inner size R + P (the latent and the RoPE key: the absorbed score sums that many
terms where the model's sums nope + P), so K and the count grow with them. A hybrid model (Qwen3-Next, Qwen3.5) runs 5
more: a recurrent layer's five products (the two input projections, the state's update, its readout, the output
projection) in place of attention's four, and Qwen3-Next's shared expert (its gate, up and down projections and its
gate's projection) beside the routed experts. Its state also passes through one update per token in a row: the chunked
rule transformers' forward without cache runs solves each chunk of C = 64 tokens by substitution, C sequential
products of inner size d_k, where a cached decode step applies the updates one by one — so each recurrent layer adds
C·d_k/K products of inner size K to the count.

For the bundled model (K = 1536, L = 30, Z = 40: its logits stay below 37 on the test prompts) ε_z ≈ 1.4e-3; the
largest difference seen between one and two threads there was 4.4e-5. A real error is orders of magnitude larger
(a slot's wrong position moves the logits by ~7; evicting one slot, by 1e-2 to 1).

**Probabilities.** log-softmax moves each entry by at most 2·max|Δz|, so |Δp_i| ≤ (e^{2ε} − 1)·p_i ≈ 2ε·p_i.

**KL.** For KL(p‖q) with both logit vectors moved by at most ε per entry, the gradients' 1-norms are
Σ_j p_j |log(p_j/q_j) − KL| ≤ 2·KL + 2·TV (with Σ p|log p/q| ≤ KL + 2·TV, from log x ≤ x − 1) for the first and
Σ_j |q_j − p_j| = 2·TV for the second, so |ΔKL| ≤ ε·(2·KL + 4·TV) ≤ ε·(2·KL + 4). Near KL = 0 the first-order terms
vanish and KL(p‖q) ≈ ½·Var_p(Δlog) ≤ 2ε², the bound for "exactly the full cache, computed another way".
"""

from __future__ import annotations

import math

import torch

U = 2.0**-24
MATMULS_PER_LAYER = 7  # q, k, v, o, gate, up, down: the products on the residual stream's path
MLA_MATMULS = 3  # a latent-attention layer's q_a / q_b and kv_a / kv_b in place of q, k, v, and the absorbed score
HYBRID_MATMULS = 5  # a recurrent layer's fifth product, and a shared expert's four (see the module's docstring)
RECURRENT_CHUNK = 64  # tokens per chunk of transformers' chunked gated delta rule: sequential updates of the state
BUNDLED_LOGIT_SCALE = 40.0  # the bundled model's logits stay below 37 on the test prompts


def residual_rounding(config, scale: float | torch.Tensor, layers: int | None = None) -> float:
    """ε: how far two summation orders can move a quantity of magnitude ``scale`` (a float, or a tensor whose largest
    entry is taken) computed after ``layers`` decoder layers (default: all, i.e. the logits) of a model with
    ``config`` (a transformers config)."""
    inner = max(config.hidden_size, getattr(config, "intermediate_size", None) or config.hidden_size)
    products = MATMULS_PER_LAYER
    latent = getattr(config, "kv_lora_rank", None)
    if latent:  # MLA: the absorbed score over the latent and the RoPE key, and the low-rank projections
        inner = max(inner, latent + config.qk_rope_head_dim, getattr(config, "q_lora_rank", None) or 0)
        products += MLA_MATMULS
    depth = config.num_hidden_layers if layers is None else layers
    recurrent = sum(kind == "linear_attention" for kind in (getattr(config, "layer_types", None) or ())[:depth])
    sequential = 0.0
    if recurrent:
        products += HYBRID_MATMULS
        sequential = recurrent * RECURRENT_CHUNK * config.linear_key_head_dim / inner  # in products of inner size K
    scale = float(scale.abs().max()) if isinstance(scale, torch.Tensor) else float(scale)
    return math.sqrt(inner * (products * depth + sequential)) * U * scale


def logit_rounding(config, scale: float | torch.Tensor) -> float:
    """ε_z for logits of magnitude ``scale``: :func:`residual_rounding` after every layer."""
    return residual_rounding(config, scale)


def score_scale(queries: torch.Tensor, keys: torch.Tensor, scaling: float) -> float:
    """A bound on |s| for scores s = q·k·scaling: max‖q‖·max‖k‖·scaling (Cauchy–Schwarz). ``(..., d)`` each."""
    return float(queries.norm(dim=-1).max() * keys.norm(dim=-1).max()) * scaling


def weight_rounding(config, layer: int, queries: torch.Tensor, keys: torch.Tensor, scaling: float) -> float:
    """Relative bound on each attention weight of ``layer`` between two forwards: its scores carry the rounding of
    ``layer + 1`` layers, and softmax turns a change of at most Δs per score into |Δα_j| ≤ (e^{2Δs} − 1)·α_j."""
    return math.expm1(2 * residual_rounding(config, score_scale(queries, keys, scaling), layer + 1))


def rescored_weight_rounding(queries: torch.Tensor, keys: torch.Tensor, scaling: float) -> float:
    """The same for weights recomputed twice from the same recorded queries and keys (another batch of heads or
    rows): only the length-d dot products of the scores round differently, Δs ≤ √d·u·|s|."""
    return math.expm1(2 * math.sqrt(queries.shape[-1]) * U * score_scale(queries, keys, scaling))


def worst_ratio(ours: torch.Tensor, reference: torch.Tensor, relative: float, absolute: float = 0.0) -> float:
    """The largest |ours − reference| / (relative·|reference| + absolute), elementwise: ≤ 1 when within the bound."""
    gap = (ours.double() - reference.double()).abs()
    return float((gap / (relative * reference.double().abs() + absolute + 1e-300)).max())


def probability_rounding(eps: float) -> float:
    """Relative bound on a probability from logits moved by at most ``eps`` (|Δp| ≤ (e^{2ε} − 1)·p)."""
    return math.expm1(2 * eps)


def zero_kl_rounding(eps: float) -> float:
    """Bound on a KL between one distribution computed twice (KL ≈ ½·Var_p(Δlog p) ≤ 2ε²)."""
    return 2 * eps**2


def kl_rounding(eps: float, kl: float) -> float:
    """Bound on |ΔKL| for a KL of ``kl`` nats when both logit vectors move by at most ``eps`` per entry."""
    return eps * (2 * kl + 4) + 2 * eps**2
