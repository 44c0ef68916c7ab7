"""The prompt's last row — the step that chooses a reply's first token — as step -1 of a policy run: its record, its
blame against one no-cache forward with a float 4D mask, and the CLI on a follow-up that fails there."""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.policies import StreamingLLM
from kvviz.runs.blame import blame, restore
from kvviz.runs.compressed import RunSettings
from kvviz.runs.policy_run import run_policy
from kvviz.whatif.metrics import kl_divergence
from tests.support.rounding import kl_rounding, logit_rounding, zero_kl_rounding
from tests.support.cli import cli
from tests.support.inputs import FOLLOW_UP

TURNS = ["My name is Zorblax and I live in the city of Quintara. I like green tea and long walks by the sea. "
         "Please just reply OK.", "What is my name? Answer with the name only."]
BUDGET = 24


@pytest.fixture(scope="module")
def streaming(lm):
    return run_policy(lm, TURNS, RunSettings(StreamingLLM(), BUDGET, "decode"), max_new_tokens=8)


def test_every_reply_token_has_the_step_that_chose_it(lm, streaming, eps):
    first, second = streaming.turns
    for run in streaming.turns:
        assert [r.step for r in run.records] == list(range(-1, len(run.full_ids) - 1))
        assert run.record(-1).slot == run.prompt_end - 1 and run.steps == run.records[1:]
    # a first turn's prefill sees the whole prompt, as the full run's did: the same distribution
    assert first.record(-1).kl <= zero_kl_rounding(eps) and first.record(-1).top1_agree
    assert first.record(-1).visible == first.prompt_end - 1
    # a follow-up's prompt reads the history StreamingLLM left: the 4 sinks, the last BUDGET - 4 slots before the
    # previous turn's last decode step and that step's own slot, then its own earlier slots
    start = next(s.slot for s in second.forced.session.transcript.slots[first.prompt_end:] if s.kind == "prefill")
    assert second.record(-1).visible == BUDGET + 1 + (second.prompt_end - 1 - start)
    assert second.record(-1).kl > 0
    with pytest.raises(KvvizError, match="-1 for the prefill's last row"):
        second.record(len(second.steps))


def _visible_rows(run, budget: int) -> torch.Tensor:
    """Bool ``(n, n)``: what each row of the session saw under StreamingLLM in decode mode, from its rule alone: the
    prompt rows see the earlier slots still cached then (all of a first prompt); a decode step's row at slot t the
    4 sinks and the last budget − 4 slots (once more than ``budget`` were cached); every row itself."""
    slots = run.forced.session.transcript.slots[: run.prompt_end]
    n = len(slots)
    seen = torch.ones(n, n, dtype=torch.bool).tril()
    cached = torch.ones(n, dtype=torch.bool)  # slots not yet evicted
    for slot in slots:
        t = slot.slot
        if slot.kind == "decode" and t > budget:
            keep = torch.zeros(n, dtype=torch.bool)
            keep[:4] = True
            keep[t - (budget - 4): t] = True
            cached[:t] &= keep[:t]
        seen[t, :t] = cached[:t]
    return seen


def test_blame_of_the_prefill_row_equals_one_masked_forward(lm, eager_model, streaming, eps):
    """Step -1 of the follow-up re-run with evicted slots put back equals the prompt's last row of one no-cache
    eager forward whose rows see what StreamingLLM left them (that row: also the restored slots)."""
    run = streaming.last
    ids = run.forced.session.transcript.ids[: run.prompt_end]
    seen = _visible_rows(run, BUDGET)
    last = run.prompt_end - 1
    evicted = (~seen[last, :last]).nonzero()[:, 0].tolist()
    assert len(evicted) > 10  # the first turn's prompt, the name in it
    restores = [[], evicted[:3], evicted]
    masks = []
    for restored in restores:
        mask = torch.where(seen, 0.0, float("-inf"))
        mask[last, restored] = 0.0
        masks.append(mask)
    with torch.no_grad():
        out = eager_model(input_ids=torch.tensor([ids] * len(masks)), attention_mask=torch.stack(masks)[:, None],
                          use_cache=False)
    references = out.logits[:, last].float()
    for restored, reference in zip(restores, references):
        row = restore(streaming, restored, step=-1)
        assert row.top1_restored == (int(reference.argmax()) == run.full_ids[0])
        expected = float(kl_divergence(run.full_logits[0], reference))
        # both sides are float32 forwards of another batch shape (a batch of variants on a cache, a no-cache batch)
        assert abs(row.kl_after_restore - expected) <= kl_rounding(logit_rounding(lm.config, reference), expected)
    ranked = blame(streaming, step=-1)
    assert ranked.step == -1 and ranked.slot == last
    assert abs(ranked.kl - run.record(-1).kl) <= kl_rounding(eps, ranked.kl)
    assert {s for r in ranked.rows for s in r.slots} <= set(evicted)


def test_the_cli_names_and_blames_a_first_token_divergence():
    """H2O at 30 % of each prompt: the follow-up's reply differs from its first token on ("The dog is called Rex." /
    "I'm sorry …"); the CLI says so and blames step -1 by default."""
    args = ["policy-run", *[a for t in FOLLOW_UP for a in ("--turn", t)],
            "--policy", "h2o", "--budget", "0.3", "--max-new-tokens", "10", "--blame-unit", "word"]
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert "divergence: step -1 (the prefill's last row: the first reply token)" in out.stdout
    assert "blame at step -1 (the prefill's last row" in out.stdout
    table = out.stdout.split("step  slot")[1].splitlines()
    assert table[1].split()[0] == "-1" and table[1].split()[-1] == "≠"
    refused = cli(*args[:-2], "--blame-step", "10")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "-1 for the prefill's last row" in refused.stderr


def test_blame_of_a_step_before_a_later_flush_sees_the_cache_that_step_saw(lm, eps):
    """A QuantizedCache run rewrites its live cache at every flush: a step blamed after the run is re-run on the
    cache as it stood (its flushes only), so nothing restored gives the step's own KL. Lending the live cache instead
    (the later flushes' K/V) moved it by far more than rounding."""
    from kvviz.policies import H2O
    from kvviz.schemes.quanto import QuantoCache

    settings = RunSettings(H2O(), 32, "decode", cache_format=QuantoCache(nbits=2, q_group_size=32, residual_length=4))
    result = run_policy(lm, [TURNS[0]], settings, max_new_tokens=10)
    run = result.last
    assert len(run.forced.timeline.flushes) >= 3  # the prompt's, then one every 4 steps
    for step in (-1, 1, 4):
        ranked = blame(result, step=step, limit=4)
        assert abs(ranked.kl - run.record(step).kl) <= kl_rounding(eps, ranked.kl), step


def test_a_run_reports_every_forward_pass_and_ends_at_its_total(lm):
    """Progress counts each forward pass once: the full side's prompt and steps, then the policy's prompt, forced
    steps and free reply; the total is an upper bound until the replies are known, and the last report is exact."""
    reports = []
    result = run_policy(lm, TURNS, RunSettings(StreamingLLM(), BUDGET, "decode"), max_new_tokens=8,
                        progress=lambda done, total: reports.append((done, total)))
    passes = sum(2 * len(run.full_ids) + (len(run.policy_ids) - run.divergence - 2 if run.divergence is not None else 0)
                 for run in result.turns)
    assert [done for done, _ in reports] == list(range(1, passes + 1))
    assert all(total >= done for done, total in reports) and reports[-1] == (passes, passes)
