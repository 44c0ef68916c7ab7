"""Pure attention math on synthetic tensors against the formulas and the worked example of docs/math.md (§2–§6)."""

from __future__ import annotations

import pytest
import torch

from kvviz import attention_math as am
from kvviz.errors import KvvizError
from kvviz.whatif.metrics import ranks_of


def test_seed_section_15_worked_example():
    alpha = torch.tensor([0.05, 0.10, 0.60, 0.15, 0.10], dtype=torch.float64)
    evict_first = torch.tensor([True, False, False, False, False])
    renorm = am.renormalized(alpha, evict_first)
    assert am.evicted_mass(alpha, evict_first).item() == pytest.approx(0.05, abs=1e-15)
    assert renorm[1:].tolist() == pytest.approx([0.105, 0.632, 0.158, 0.105], abs=5e-4)
    assert renorm[1:].tolist() == pytest.approx([0.1 / 0.95, 0.6 / 0.95, 0.15 / 0.95, 0.1 / 0.95], abs=1e-15)
    evict_third = torch.tensor([False, False, True, False, False])
    assert am.evicted_mass(alpha, evict_third).item() == pytest.approx(0.60, abs=1e-15)
    kept = am.renormalized(alpha, evict_third)[~evict_third]
    assert kept.tolist() == pytest.approx([0.125, 0.25, 0.375, 0.25], abs=1e-15)


def _random_head(seed: int, n: int = 12, d: int = 16):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, d, generator=generator, dtype=torch.float64)
    k = torch.randn(1, n, d, generator=generator, dtype=torch.float64)
    v = torch.randn(1, n, d, generator=generator, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("seed", range(5))
def test_closed_form_equals_softmax_over_retained_set(seed):
    q, k, v = _random_head(seed)
    alpha = am.causal_weights(q, k, 0.25)[0, 0]
    evicted = torch.zeros(12, dtype=torch.bool)
    evicted[[1, 4, 5, 9]] = True
    o = am.output(alpha, v[0])
    closed = am.evicted_output(o, alpha, v[0], evicted)
    direct_alpha = torch.softmax((q[0] @ k[0, ~evicted].T * 0.25)[0], -1)
    direct = direct_alpha @ v[0, ~evicted]
    assert torch.allclose(closed, direct, atol=1e-12, rtol=0)
    change = am.evicted_change(o, alpha[None], v, evicted[None], am.evicted_mass(alpha, evicted)[None])  # one head
    assert torch.allclose(change[0], direct - o, atol=1e-12, rtol=0)
    assert torch.allclose(am.renormalized(alpha, evicted)[~evicted], direct_alpha, atol=1e-14, rtol=0)
    # masking in causal_weights is the same set approximation
    masked = am.causal_weights(q, k, 0.25, evicted[None])[0, 0]
    assert torch.allclose(masked[~evicted], direct_alpha, atol=1e-14, rtol=0) and masked[evicted].sum() == 0


@pytest.mark.parametrize("seed", range(5))
def test_quantization_terms_sum_to_the_total(seed):
    q, k, v = _random_head(seed)
    generator = torch.Generator().manual_seed(100 + seed)
    k_hat = k + 0.05 * torch.randn(k.shape, generator=generator, dtype=torch.float64)
    v_hat = v + 0.05 * torch.randn(v.shape, generator=generator, dtype=torch.float64)
    alpha = am.causal_weights(q, k, 0.25)[0, 0]
    alpha_hat = am.causal_weights(q, k_hat, 0.25)[0, 0]
    weight, content = am.quantization_split(alpha, alpha_hat, v[0], v_hat[0] - v[0])
    total = am.output(alpha_hat, v_hat[0]) - am.output(alpha, v[0])
    assert torch.allclose(weight + content, total, atol=1e-14, rtol=0)
    assert weight.norm() > 0 and content.norm() > 0


def test_full_eviction_is_refused_not_nan():
    alpha = torch.tensor([0.5, 0.5], dtype=torch.float64)
    everything = torch.tensor([True, True])
    with pytest.raises(KvvizError, match="ρ = 1"):
        am.renormalized(alpha, everything)
    with pytest.raises(KvvizError):
        am.evicted_output(torch.zeros(3, dtype=torch.float64), alpha, torch.ones(2, 3, dtype=torch.float64), everything)


def test_gqa_expansion_matches_transformers_repeat_kv():
    from transformers.integrations.sdpa_attention import repeat_kv

    keys = torch.randn(3, 5, 4)
    assert torch.equal(am.expand_kv(keys, 9), repeat_kv(keys[None], 3)[0])


@pytest.mark.parametrize("seed", range(6))
def test_ranks_match_a_stable_sort(seed):
    """docs/math.md §6's rank changes: a token's rank is its place in the logits sorted descending, ties by token id (argmax's
    order). Half the cases draw logits from a few values, so ties are everywhere; the ids include the least likely."""
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randint(0, 40, (3000,), generator=generator).float() if seed % 2
              else torch.randn(3000, generator=generator))
    ids = torch.cat([torch.topk(logits, 5).indices, torch.randint(0, 3000, (15,), generator=generator),
                     logits.argmin()[None]])
    order = torch.argsort(logits, descending=True, stable=True)
    expected = torch.empty_like(order)
    expected[order] = torch.arange(len(logits))
    assert ranks_of(logits, ids).tolist() == expected[ids].tolist()
    other = logits.flip(0)  # a second row, ranked in the same call (the what-if ranks both of its runs at once)
    order = torch.argsort(other, descending=True, stable=True)
    expected_other = torch.empty_like(order)
    expected_other[order] = torch.arange(len(other))
    assert ranks_of(torch.stack([logits, other]), ids).tolist() == [expected[ids].tolist(),
                                                                     expected_other[ids].tolist()]


@pytest.mark.parametrize("scale", [0.0, 1e-6, 1e-4, 1e-2, 1.0, 10.0])
def test_float32_kl_matches_a_float64_reference(scale):
    """KL computed from float32 logits against log_softmax in float64, over a 49k vocabulary with a constant shift in
    the other logits (which softmax ignores). The bound holds for any summation order a CPU's kernels take (the sums
    over the vocabulary add exact float64 products in float64; the probabilities are normalized in float64): each
    logit carries at most ε = u·(range(z) + |y − z|max + 2·|x|max + 8) of rounding (the exponent's argument, exp's
    and the quotient's ulps, the difference and the two shifts by m, u = 2⁻²⁴), which moves KL by at most
    ε·(2·KL + 4·TV) and the probabilities' sum (an error of scale, second order in the log1p form) by ε·|Z − 1|;
    expm1's own rounding adds ≤ 2u·E_p|expm1 x| (x the centred difference, Z = E_p e^x). A float32
    log_softmax(p) − log_softmax(q) (~1e-7 absolute at any KL) or a float32 sum fails it at the small scales."""
    from kvviz.whatif.metrics import kl_divergence

    generator = torch.Generator().manual_seed(0)
    full = torch.randn(49152, generator=generator) * 4
    others = full + scale * torch.randn(3, 49152, generator=generator) + torch.tensor([[0.0], [5.0], [-30.0]])
    log_p, log_q = torch.log_softmax(full.double(), -1), torch.log_softmax(others.double(), -1)
    p, q = log_p.exp(), log_q.exp()
    reference = (p * (log_p - log_q)).sum(-1)
    shift = others.double() - full.double()
    x = shift - (p * shift).sum(-1, keepdim=True)
    u = 2.0 ** -24
    epsilon = u * (float(full.max() - full.min()) + shift.abs().amax(-1) + 2 * x.abs().amax(-1) + 8)
    tv = (p - q).abs().sum(-1) / 2
    scale_error = ((p * x.exp()).sum(-1) - 1).abs()
    bound = epsilon * (2 * reference + 4 * tv + scale_error) + 2 * u * (p * torch.expm1(x).abs()).sum(-1) + 1e-15
    ours = kl_divergence(full, others)
    assert ((ours - reference).abs() <= bound).all(), (ours, reference, bound)
    one_by_one = torch.stack([kl_divergence(full, row) for row in others])
    assert ((one_by_one - reference).abs() <= bound).all()
    assert float(kl_divergence(full, full)) == 0.0  # identical logits: exactly 0


def test_float32_kl_of_far_apart_distributions_does_not_overflow():
    from kvviz.whatif.metrics import kl_divergence

    full = torch.zeros(1000)
    other = full.clone()
    other[:10] += 200  # expm1 would overflow float32 here: the log-sum-exp form takes over
    log_p = torch.log_softmax(full.double(), -1)
    reference = float((log_p.exp() * (log_p - torch.log_softmax(other.double(), -1))).sum())
    assert float(kl_divergence(full, other)) == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_compare_against_argmax_and_a_stable_sort(seed):
    """The next-token table: the top-1 change is argmax against argmax (ties at the top: the lowest id, as argmax
    picks it), every row's ranks are places in a stable descending sort (which of tied tokens topk shows is its
    own choice), and a kept Reference of the full side gives the very same table as the full logits given anew."""
    from kvviz.whatif.metrics import Reference, compare

    generator = torch.Generator().manual_seed(seed)
    draw = lambda: (torch.randint(0, 6, (500,), generator=generator).float() if seed % 2  # noqa: E731
                    else torch.randn(500, generator=generator))
    full, edited = draw(), draw()
    if seed == 2:
        edited = full.clone()
        edited[full.argmax()] -= 1e-3  # the top-1 changes by a hair
    table = compare(full, edited, 5, str)
    assert table.top1_changed == (int(full.argmax()) != int(edited.argmax()))

    def places(logits):
        order = torch.argsort(logits, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(logits))
        return rank

    for rows, own, other in ((table.full, full, edited), (table.edited, edited, full)):  # topk picks among ties
        ids = [r.id for r in rows]
        assert [r.rank for r in rows] == places(own)[ids].tolist() == sorted(places(own)[ids].tolist())
        assert [r.rank_other for r in rows] == places(other)[ids].tolist()
        assert bool((own[ids] >= own.topk(5).values[-1]).all())  # five of the most likely
    assert compare(Reference(full), edited, 5, str) == table


def test_visible_softmax_leaves_the_callers_scores_alone_unless_they_are_its_own():
    """Masked in place only where the caller says the scores are its own (fresh from a product); either way the same
    weights, bit for bit."""
    generator = torch.Generator().manual_seed(4)
    s = torch.randn(6, 5, 9, generator=generator)  # (H, q, n): 2 KV heads of 3 query heads
    evicted = torch.zeros(2, 9, dtype=torch.bool)
    evicted[0, 1] = evicted[1, 6] = True
    before = s.clone()
    weights = am.visible_softmax(s, evicted, window=6)
    assert torch.equal(s, before)
    assert torch.equal(am.visible_softmax(s.clone(), evicted, window=6, own=True), weights)
    assert torch.equal(weights[:3, :, 1], torch.zeros(3, 5)) and bool((weights[3:, :, 1] > 0).any())
