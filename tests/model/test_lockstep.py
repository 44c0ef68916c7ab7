"""Policy runs decoded as one batch (kvviz.runs.lockstep): the same runs as one by one, and against an independent
reference, on the real bundled model.

Batched and one-by-one runs differ only in the order of the sums of their matrix products (a matrix-matrix kernel
for B rows where the other side ran a matrix-vector one), so logits agree to ε_z of tests/support/rounding.py and KLs to
its KL bound. Decisions made from them (tokens, evictions) are equal unless two candidates lie within that rounding
of each other, which the prompts here do not have (the test would show it as an unequal timeline or token).
"""

from __future__ import annotations

import pytest
import torch

from kvviz.policies import H2O, SnapKV, StreamingLLM
from kvviz.runs.compressed import RunSettings
from kvviz.runs.policy_run import run_policies
from kvviz.whatif.metrics import kl_divergence
from tests.support.rounding import kl_rounding, logit_rounding

PROMPT = "My name is Zorblax and I live in the city of Quintara. I like green tea. What is my name?"
FOLLOW_UP = ("Remember the secret word: mango.", "What is the secret word?")
SETTINGS = [RunSettings(H2O(), 24, "decode"), RunSettings(StreamingLLM(), 20, "decode"),
            RunSettings(SnapKV(), 0.5, "prefill"), RunSettings(H2O(), 0.5, "decode", every=2)]


def _passes(lm, run, dim: int = 0):
    """``run()`` and the sizes of dimension ``dim`` of the model's forward passes' input ids (0: batch rows)."""
    sizes = []
    hook = lm.model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(kwargs["input_ids"].shape[dim]), with_kwargs=True)
    try:
        return run(), sizes
    finally:
        hook.remove()


@pytest.mark.parametrize("turns, tokens", [((PROMPT,), 12), (FOLLOW_UP, 10)], ids=["one turn", "two turns"])
def test_batched_runs_equal_the_runs_one_by_one(lm, eps, turns, tokens):
    batched, sizes = _passes(lm, lambda: run_policies(lm, turns, SETTINGS, tokens))
    alone, single = _passes(lm, lambda: run_policies(lm, turns, SETTINGS, tokens, batch=False))
    forks = sum(run.turns[0].divergence is not None for run in batched)
    assert len(sizes) < len(single) and set(single) == {1}  # it did batch: one pass held the full run and every
    assert max(sizes) >= 1 + len(SETTINGS) + forks  # forced run, and the free runs forked in the first turn
    for ours, reference in zip(batched, alone, strict=True):
        for turn, ref in zip(ours.turns, reference.turns, strict=True):
            assert (turn.full_ids, turn.policy_ids, turn.divergence) == (ref.full_ids, ref.policy_ids, ref.divergence)
            assert (turn.prompt_ids, turn.prompt_end) == (ref.prompt_ids, ref.prompt_end)
            assert torch.equal(turn.forced.timeline.evicted_at, ref.forced.timeline.evicted_at)
            for entry in turn.forced.session.cache.layers:  # the run keeps its own cache, not a row of the batch's
                assert entry.keys.untyped_storage().nbytes() == entry._buffers[0].nbytes
            assert (turn.full_logits - ref.full_logits).abs().max() <= eps
            for step, other in zip(turn.records, ref.records, strict=True):
                assert (step.step, step.slot, step.top1_agree, step.policy_top1) == (
                    other.step, other.slot, other.top1_agree, other.policy_top1)
                assert step.visible == other.visible and step.by_segment == other.by_segment
                assert abs(step.kl - other.kl) <= kl_rounding(eps, other.kl)
        assert ours.evictions() == reference.evictions()


def test_a_batched_streaming_llm_run_equals_one_masked_forward(lm, eager_model):
    """Two StreamingLLM budgets and the full run decode as one batch; one no-cache forward of the whole sequence per
    budget, with a float 4D mask where each step's row sees sink + window (and itself), gives each step's logits
    (eager attention, nothing of kvviz involved): the run's KL and top-1 at every step equal those of the reference
    logits, and the full run's logits equal a causal forward's."""
    budgets, tokens = (20, 30), 10
    runs, sizes = _passes(lm, lambda: run_policies(lm, [PROMPT], [RunSettings(StreamingLLM(), b, "decode")
                                                                   for b in budgets], tokens))
    assert max(sizes) >= 1 + len(budgets)  # the full row and both forced rows in one pass

    for budget, run in zip(budgets, runs):
        turn = run.last
        prompt = turn.prompt_end
        ids = turn.prompt_ids + turn.full_ids[:-1]  # the last reply token is never processed
        mask = torch.full((len(ids), len(ids)), float("-inf")).triu(1)
        with torch.no_grad():
            causal = eager_model(input_ids=torch.tensor([ids]), attention_mask=mask[None, None], use_cache=False)
        for step in range(len(turn.full_ids) - 1):
            slot = prompt + step
            if slot > budget:  # over the budget: sinks + the most recent budget - 4, and itself
                mask[slot] = float("-inf")
                mask[slot, list(range(4)) + list(range(slot - (budget - 4), slot + 1))] = 0
        with torch.no_grad():
            out = eager_model(input_ids=torch.tensor([ids]), attention_mask=mask[None, None], use_cache=False)
        full = causal.logits[0, prompt - 1:]  # the prefill's last row, then each decode step's
        assert (full - turn.full_logits).abs().max() <= logit_rounding(lm.config, full)
        eps = logit_rounding(lm.config, out.logits)
        for record in turn.records:
            reference = out.logits[0, prompt + record.step]  # step -1: the prefill's last row
            kl = float(kl_divergence(turn.full_logits[record.step + 1], reference))
            assert abs(record.kl - kl) <= 2 * kl_rounding(eps, kl), record.step  # two roundings: full and policy side
            assert record.policy_top1 == int(reference.argmax())


@pytest.mark.parametrize("back", [0, 5], ids=["newest step", "an earlier step"])
def test_a_comparison_of_policies_equals_a_what_if_each(make_chat, lm, eps, back):
    """The policies' edited runs as variants of one batched pass give each what-if's numbers: KL and TV to the
    rounding of another batch shape, the top-1 flip, ρ and the bytes exactly (the same full run and masks). Only the
    edited logits move, by at most ε each, so each p_i moves by at most (e^{2ε} − 1)·p_i and TV by at most
    ½·(e^{2ε} − 1) ≈ ε (tests/support/rounding.py); 2ε leaves room."""
    from kvviz.whatif.compare_policies import _alone, compare_policies

    session = make_chat(PROMPT, generate=8)
    at = len(session) - 1 - back
    policies = [H2O(), StreamingLLM(), SnapKV()]
    batched, sizes = _passes(lm, lambda: compare_policies(session, policies, 16, at), dim=1)
    assert sizes[0] == len(policies)  # one pass, a variant per policy (then the what-if's full run)
    for row in batched.rows:
        kl, tv, flipped, rho, edited_bytes = _alone(session, batched.edits[row.policy], at)
        assert abs(row.kl - kl) <= kl_rounding(eps, kl) and abs(row.tv - tv) <= 2 * eps
        assert (row.top1_changed, row.mean_rho, row.edited_bytes) == (flipped, rho, edited_bytes)
        assert row.kl > 1e-4  # each policy evicts something that matters at a budget of 16
    assert len(session) == at + 1 + back  # the lent cache was cut back


def test_policies_deciding_again_at_a_step_reuse_the_attention_sums(make_chat, lm):
    """A second comparison at the same cache version decides from the attention sums the session kept: the same
    edits, and what is kept is not changed by the policies that read it (each gets a copy)."""
    from kvviz.whatif.compare_policies import compare_policies

    session = make_chat(PROMPT)
    policies = [H2O(), SnapKV()]
    first = compare_policies(session, policies, 16)
    kept = {key: value.clone() for key, value in session.memo.entries("received_attention").items()}
    assert len(kept) == 2  # H2O's sum over every query, SnapKV's over its window
    again = compare_policies(session, policies, 16)
    assert all(first.edits[name] == again.edits[name] for name in first.edits) and first.rows == again.rows
    assert all(torch.equal(value, kept[key]) for key, value in session.memo.entries("received_attention").items())
    session.generate(1)  # a new cache version: summed anew, the old sums dropped
    compare_policies(session, policies, 16)
    assert {key[0] for key in session.memo.entries("received_attention")} == {len(session) - 1}
