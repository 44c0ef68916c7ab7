"""A run that keeps its cache and reads a subset per step (``RunSettings.reader``: any policy's scores choose, before
each decode step, the slots that step reads per layer and KV head — sparse attention as engines run it), on the
bundled model.

Reference: one forward of transformers' eager model without cache, each layer given a float 4D mask per query head
(0 allowed, −inf masked) whose row of each step sees the slots that step read and itself — nothing of kvviz involved.
Tolerance: the model's logit rounding (tests/support/rounding.py), as for every run oracle."""

from __future__ import annotations

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies import H2O, SnapKV, StreamingLLM
from kvviz.runs.blame import blame, restorable
from kvviz.runs.compressed import RunSettings
from kvviz.runs.policy_run import run_policy
from kvviz.whatif import what_if
from tests.support.references import forced_run, greedy_tokens, per_head_masked_forward
from tests.support.rounding import kl_rounding, logit_rounding

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"
READS, STEPS = 16, 8


@pytest.mark.parametrize("reader", [H2O(), SnapKV()], ids=["h2o", "snapkv"])
def test_each_step_reads_its_readers_pick_and_the_cache_keeps_everything(lm, eager_model, reader):
    """Teacher-forced on the full run's tokens: every step sees exactly 16 slots per layer and KV head (the picks
    differ between layers, heads and steps), equals the masked forward, and nothing is evicted: the next step could
    read any slot."""
    tokens = greedy_tokens(lm, PROMPT, STEPS)
    run, logits, seen = forced_run(lm, RunSettings(reader=reader, reads=READS), PROMPT, tokens)
    prompt = run.prompt_end[0]
    for step in range(STEPS):
        assert (seen[step][:, :, : prompt + step].sum(-1) == READS).all(), step
    assert not torch.equal(seen[0][:, :, :prompt], seen[0][:1, :1, :prompt].expand_as(seen[0][:, :, :prompt]))
    assert not torch.equal(seen[0][..., :prompt], seen[1][..., :prompt])
    assert bool(run.alive().all()) and not run.timeline.at  # the cache keeps every slot, nothing was committed
    out = per_head_masked_forward(eager_model, run.session.transcript.ids[: prompt + STEPS], seen, prompt)
    for step in range(STEPS):
        reference = out[prompt + step]
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step
    session = run.session  # time travel: a step's own what-if re-runs it as it read
    assert what_if(session, Edit(), at=prompt + 3).next_token.kl == 0
    rows = session.weights(0, prompt + 3, prompt + 4)[:, 0]  # (H, n): over the step's reads and itself
    assert set((rows > 0).sum(-1).tolist()) == {READS + 1}


def test_a_reader_beside_an_evicting_policy_reads_among_what_the_policy_kept(lm):
    """RocketKV's shape: a policy compresses the prompt (prefill, budget 32), then each step reads 16 of what is left
    (StreamingLLM's window as the reader here): the slots a step read are among the kept ones."""
    settings = RunSettings(SnapKV(), 32, "prefill", reader=StreamingLLM(), reads=READS)
    run, _, seen = forced_run(lm, settings, PROMPT, greedy_tokens(lm, PROMPT, 3))
    prompt = run.prompt_end[0]
    kept = ~run.timeline.hidden(prompt + 10**6, prompt)  # what the prompt's compression kept, (L, KV, prompt)
    assert (kept.sum(-1) == 32).all()
    for step in range(3):
        assert (seen[step][:, :, :prompt] & ~kept).sum() == 0 and (seen[step].sum(-1) <= READS).all()
    assert "each step reads 16 by streaming_llm" in settings.label


def test_blame_of_a_reading_run_puts_unread_slots_back_and_nothing_back_is_the_runs_kl(lm):
    """Blame's candidates are the slots hidden from the step (here: those its reader did not pick); restoring nothing
    gives the run's own KL at that step (both sides rounded: twice the KL's rounding)."""
    result = run_policy(lm, [PROMPT], RunSettings(reader=H2O(), reads=READS), max_new_tokens=4)
    assert restorable(result) == ["evicted"]
    ranked = blame(result, step=2, limit=6)
    record = result.last.record(2)
    eps = logit_rounding(lm.config, result.last.full_logits[3])
    assert abs(ranked.kl - record.kl) <= 2 * kl_rounding(eps, record.kl) and len(ranked.rows) == 6


@pytest.mark.parametrize("settings, words", [
    (dict(reader=H2O()), "a reader needs a count of slots to read per step"),
    (dict(reads=8), "a reader needs a count"),
    (dict(reader=H2O(), reads=0), "reads must be a positive whole number of slots, got 0"),
    (dict(reader=StreamingLLM(), reads=8, positions="rerotated", policy=StreamingLLM(), budget=20),
     "a reader hides slots from one step only"),
])
def test_a_reader_without_a_count_or_with_moved_positions_is_refused_in_one_line(settings, words):
    with pytest.raises(KvvizError, match=words):
        RunSettings(**settings)


def test_the_command_line_runs_a_reader(lm):
    """``policy-run --read-with h2o --reads 16``: the run of the library, its reader in the JSON report; a reader
    without a count is one line."""
    import json

    from tests.support.cli import cli

    done = cli("policy-run", "--turn", PROMPT, "--read-with", "h2o", "--reads", "16", "--max-new-tokens", "3",
               "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["reader"] == {"name": "h2o", "params": H2O().settings(), "reads": 16} and report["policy"] is None
    library = run_policy(lm, [PROMPT], RunSettings(reader=H2O(), reads=16), max_new_tokens=3)
    assert [s["kl"] for s in report["steps"]] == pytest.approx([r.kl for r in library.last.records], abs=1e-6)
    refused = cli("policy-run", "--turn", PROMPT, "--read-with", "h2o")
    assert refused.returncode != 0 and "--read-with POLICY and --reads N go together" in refused.stderr
