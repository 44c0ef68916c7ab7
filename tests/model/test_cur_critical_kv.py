"""CUR (CurDKV's leverage scores) and the CriticalKV wrapper against references written here from their formulas in
float64, on the bundled model's cache: scores, and kept sets per layer and KV head.

Tolerances. A CUR score is a product of two squared row norms (D = 64 terms each), each divided by a window's sum
(≤ 16 terms), divided by the sum over n ≈ 400 candidates: in float32 that is within (2·64 + 2·16 + 400 + 4)·u ≈
3.4e-5 of itself (relative), u = 2⁻²⁴. CriticalKV's rescaling ‖v W_O^h‖₁ is a sum of 576 absolute values of 64-term
dot products, averaged over 3 heads: (64 + 576 + 3)·u ≈ 3.9e-5 relative; times a key norm (64 terms) plus ε.
Kept sets are compared exactly in every slot whose float64 score is further than twice the bound from the lowest
kept float64 score (the test counts them: nearly all).
"""

from __future__ import annotations

import pytest
import torch

from kvviz.policies import CUR, CriticalKV
from kvviz.policies.base import Candidates, Ratio, slots_kept
from kvviz.session import Session

U = 2.0**-24
CUR_BOUND = (2 * 64 + 2 * 16 + 400 + 4) * U
CRITICAL_BOUND = (64 + 576 + 3 + 64 + 4) * U
PROMPT = " ".join(f"Parcel {i} went to {['Oslo', 'Lima', 'Pune', 'Kiev', 'Agra'][i % 5]} on day {i % 9}."
                  for i in range(32)) + " Which parcel went to Pune on day 2?"


@pytest.fixture(scope="module")
def prompt(make_chat, lm) -> Session:
    session = make_chat(PROMPT)
    return session


def cur_reference(keys: torch.Tensor, values: torch.Tensor, leverage: str, local: bool, window: int,
                  sinks: int) -> torch.Tensor:
    """CurDKV's scores of one KV head by the formula, in float64: ``(n,)`` from keys and values ``(n, D)``."""
    k2, v2 = (keys.double() ** 2).sum(-1), (values.double() ** 2).sum(-1)
    if local:
        for norms in (k2, v2):
            for start in range(0, len(norms), window):
                norms[start: start + window] /= norms[start: start + window].sum()
    combined = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[leverage]
    scores = combined / combined.sum()
    scores[:sinks] = 1.0
    return scores


def assert_kept(kept: torch.Tensor, reference: torch.Tensor, budget: int, bound: float) -> int:
    """``kept`` (n,) bool holds ``budget`` slots and, of the slots clear of the reference's threshold by more than
    ``2·bound`` (relative), exactly those above it; returns how many were clear."""
    assert int(kept.sum()) == budget
    threshold = reference.sort(descending=True).values[budget - 1]
    clear = (reference - threshold).abs() > 2 * bound * reference.abs().clamp(min=threshold.abs())
    assert torch.equal(kept[clear], (reference > threshold)[clear])
    return int(clear.sum())


@pytest.mark.parametrize("leverage,local,window", [("kv_product", True, 16), ("kv_avg", True, 7), ("key", False, 16),
                                                   ("value", True, 32)])
def test_cur_scores_and_kept_sets_follow_the_formula(prompt, leverage, local, window):
    lm, n = prompt.lm, len(prompt) - 1
    policy = CUR(leverage=leverage, local=local, window=window, ties="topk")
    decision = policy.decision(prompt, Ratio(0.5), n)
    keep, clear = slots_kept(Ratio(0.5), n), 0
    for layer in range(lm.layers):
        keys, values = (t[:, :n] for t in prompt.layer_kv(layer))
        for head in range(lm.kv_heads):
            reference = cur_reference(keys[head], values[head], leverage, local, window, 4)
            assert torch.allclose(decision.scores[layer, head].double(), reference, rtol=CUR_BOUND, atol=0)
            clear += assert_kept(~decision.evicted[layer, head], reference, keep, CUR_BOUND)
    assert clear > 0.95 * lm.layers * lm.kv_heads * n


def test_cur_in_a_compressed_cache_windows_the_slots_still_held(prompt):
    lm, n = prompt.lm, len(prompt) - 1
    alive = torch.rand(lm.layers, lm.kv_heads, n, generator=torch.Generator().manual_seed(3)) > 0.3
    alive[..., :4] = True
    scores = CUR().score(Candidates(prompt, n, 64, alive))
    for layer in (0, 17, lm.layers - 1):
        keys, values = (t[:, :n] for t in prompt.layer_kv(layer))
        for head in range(lm.kv_heads):
            slots = alive[layer, head].nonzero()[:, 0]
            reference = cur_reference(keys[head, slots], values[head, slots], "kv_product", True, 16, 0)
            reference[slots < 4] = 1.0
            assert torch.allclose(scores[layer, head, slots].double(), reference, rtol=CUR_BOUND, atol=0)


def l1_rescaling(lm, layer: int, values: torch.Tensor) -> torch.Tensor:
    """``‖v W_O^h‖₁`` averaged over each KV group's query heads, one head at a time in float64: ``(KV, n)``."""
    w_o = lm.model.model.layers[layer].self_attn.o_proj.weight.double()  # (hidden, H·D)
    dim, groups = values.shape[-1], lm.heads // lm.kv_heads
    norms = [(values[h // groups].double() @ w_o[:, h * dim: (h + 1) * dim].t()).abs().sum(-1) for h in range(lm.heads)]
    return torch.stack(norms).reshape(lm.kv_heads, groups, -1).mean(1)


@pytest.mark.parametrize("budget,first_stage", [(Ratio(0.5), 0.5), (Ratio(0.75), 0.3), (40, 0.5), (Ratio(0.5), 0.0)])
def test_critical_kv_rescales_key_norm_by_the_output_projected_values(prompt, budget, first_stage):
    lm, n = prompt.lm, len(prompt) - 1
    decision = CriticalKV(inner="key_norm", first_stage=first_stage, ties="topk").decision(prompt, budget, n)
    keep = slots_kept(budget, n)
    stage_one = 0 if first_stage == 0 else max(1, int(float(budget) * n * first_stage) if isinstance(budget, Ratio)
                                                else int(keep * first_stage))
    clear = 0
    for layer in range(lm.layers):
        keys, values = (t[:, :n] for t in prompt.layer_kv(layer))
        inner = -keys.double().norm(dim=-1)  # (KV, n): key norm's keep-score
        rescaled = (inner + 1e-4) * l1_rescaling(lm, layer, values)
        for head in range(lm.kv_heads):
            first = decision.scores[layer, head] == torch.finfo(torch.float32).max  # stage 1's slots, as kvpress marks
            kept, rest = ~decision.evicted[layer, head], ~first
            if stage_one:
                clear += assert_kept(first, inner[head], stage_one, 64 * U)
            assert bool(kept[first].all())
            assert torch.allclose(decision.scores[layer, head][rest].double(), rescaled[head][rest],
                                  rtol=CRITICAL_BOUND, atol=0)
            clear += assert_kept(kept[rest], rescaled[head][rest], keep - stage_one, CRITICAL_BOUND)
    assert clear > 0.95 * lm.layers * lm.kv_heads * (n + (n if stage_one else 0) - stage_one)


def test_critical_kv_in_a_run_extends_its_norms_slot_by_slot_to_the_same_numbers(lm):
    from kvviz.policies.critical_kv import output_l1
    from kvviz.runs.compressed import CompressedSession, RunSettings

    run = CompressedSession(lm, RunSettings(CriticalKV(inner="key_norm"), 24, "decode"))
    run.add_turn("Name three rivers of Europe and say which is the longest.")
    for _ in range(5):
        run.step()
    session = run.session
    n = max(layer_values.shape[1] for layer_values, _ in run.scratch.values())  # the last decision's candidates
    for layer in (0, lm.layers - 1):
        values, norms = run.scratch[("critical_kv", layer)]
        assert norms.shape == (lm.kv_heads, n)
        direct = output_l1(session.lm.model.model.layers[layer].self_attn, session.layer_kv(layer)[1][:, :n].float())
        assert torch.allclose(norms, direct, rtol=CRITICAL_BOUND, atol=0)  # extended, yet the numbers of one pass
