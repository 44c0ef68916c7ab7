"""Re-rotated positions (StreamingLLM's positions within the cache) against a reference that compacts the cache
physically and moves the keys with transformers' own RoPE functions (docs/math.md §9)."""

from __future__ import annotations

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies import H2O, StreamingLLM
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.schemes.kivi import Kivi
from kvviz.whatif import what_if
from tests.support.references import compacted_rerotated_steps
from tests.support.rounding import kl_rounding, logit_rounding, probability_rounding

PROMPT = "My name is Zorblax and I live in the city of Quintara. I like green tea. What is my name?"


def test_rerotated_streaming_llm_equals_a_compacted_cache(make_chat, lm, eps):
    budget, steps = 20, 10
    plain = make_chat(PROMPT)
    tokens = []
    for _ in range(steps):
        tokens.append(plain.pending)
        plain.step()
    run = CompressedSession(lm, RunSettings(StreamingLLM(), budget, "decode", positions="rerotated"))
    run.add_turn(PROMPT)
    logits = [run.step(token) for token in tokens]

    ids = run.session.transcript.ids[: run.prompt_end[0]]
    for step, (reference, _) in enumerate(compacted_rerotated_steps(lm, ids, tokens, budget)):
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step
    # time travel: a step's what-if, taken at the end, sees the keys where they were then
    slot = run.prompt_end[0] + 6
    result = what_if(run.session, Edit(), at=slot, topk=3)
    probs = torch.softmax(logits[6].double(), -1)
    assert result.next_token.full[0].prob == pytest.approx(float(probs.max()), rel=probability_rounding(eps))


def test_rerotated_positions_are_refused_where_they_make_no_sense(lm):
    for settings in (dict(policy=H2O(), budget=16), dict(policy=StreamingLLM(), budget=16, cache_format=Kivi()),
                     dict(policy=None, budget=None, cache_format=Kivi())):
        with pytest.raises(KvvizError, match="re-rotated positions need"):
            RunSettings(**settings, positions="rerotated")


def test_blame_of_a_rerotated_run_sees_each_step_as_it_stood(lm, eps):
    from kvviz.runs.blame import blame
    from kvviz.runs.policy_run import run_policy

    result = run_policy(lm, [PROMPT], RunSettings(StreamingLLM(), 24, "decode", positions="rerotated"), 8)
    for step in (0, 3, len(result.last.steps) - 1):
        ranked = blame(result, step=step, limit=4)
        assert abs(ranked.kl - result.last.steps[step].kl) <= kl_rounding(eps, ranked.kl), step
