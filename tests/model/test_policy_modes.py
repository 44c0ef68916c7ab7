"""Policy runs across modes, budgets and turns (docs/math.md §9): what each step saw, on the real bundled model."""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.policies import (CUR, H2O, TOVA, AdaKV, ChunkKV, CriticalKV, ExpectedAttention, KeyDiff, KVZip, LagKV,
                            PyramidKV, SnapKV, StreamingLLM)
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.schemes.kivi import Kivi
from kvviz.runs.policy_run import NEVER, run_policy

PROMPT = "My name is Zorblax and I live in the city of Quintara. I like green tea and long walks by the sea. What is my name?"


@pytest.mark.parametrize("policy, mode, every, budget", [
    (TOVA(), "decode", 1, 20), (SnapKV(), "decode", 1, 20), (H2O(), "both", 1, 20), (StreamingLLM(), "decode", 3, 20),
    (PyramidKV(), "prefill", 1, 20), (AdaKV(), "both", 1, 20), (H2O(), "decode", 1, 0.5), (KeyDiff(), "both", 1, 20),
    (KeyDiff(ties="topk"), "decode", 2, 20), (LagKV(lag=8), "decode", 1, 20), (LagKV(lag=8, ties="topk"), "both", 1, 20),
    (ChunkKV(chunk=4), "decode", 1, 20), (ExpectedAttention(future=16), "both", 1, 20), (CUR(), "decode", 1, 20),
    (CriticalKV(inner="snapkv"), "both", 1, 20), (KVZip(), "prefill", 1, 20), (KVZip(chunk=16), "decode", 1, 20)])
def test_what_each_step_sees(lm, policy, mode, every, budget):
    run = CompressedSession(lm, RunSettings(policy, budget, mode, every))
    run.add_turn(PROMPT)
    prompt, keep = len(run), run.keep
    assert keep == (budget if isinstance(budget, int) else round(budget * prompt))
    seen = []
    for _ in range(8):
        run.step()
        seen.append(run.seen.clone())
    for step, mask in enumerate(seen):
        counts = mask.sum(-1).float()  # (L, KV): slots the step saw besides its own
        if mode == "prefill":  # compressed once after the prompt; decode slots add up afterwards
            assert float(counts.mean()) == pytest.approx(keep + step, abs=0.5)
        elif every == 1:
            uneven = isinstance(policy, (PyramidKV, AdaKV, KVZip))
            assert float(counts.mean()) <= keep + 0.5 and (uneven or bool((counts <= keep).all()))
        else:  # compressed every `every` steps: up to every - 1 more in between
            assert bool((counts <= keep + step % every).all()) and bool((counts >= keep).all())
        if step:  # evictions are final: a slot hidden from one step is hidden from the next
            assert not bool((~seen[step - 1] & mask[:, :, : seen[step - 1].shape[-1]]).any())


def test_turns_carry_the_free_run_and_keep_their_own_timeline(lm):
    result = run_policy(lm, [PROMPT, "And which city do I live in?"], RunSettings(StreamingLLM(), 24, "decode"),
                        max_new_tokens=10)
    first, second = result.turns
    assert first.changed and first.divergence == 0
    assert second.divergence == -1 and second.policy_ids[0] != second.full_ids[0]  # its prefill already differs
    session = second.forced.session  # the forced run of turn 2 went on from the policy's own reply to turn 1
    reply = first.policy_ids[:-1] if first.policy_ids[-1] in lm.stop_ids else first.policy_ids
    assert session.transcript.ids[first.prompt_end : first.prompt_end + len(reply)] == reply
    for turn, run in enumerate(result.turns):
        steps = result.eviction_steps(turn)
        inside = steps[(steps >= 0) & (steps < NEVER)]
        assert bool((inside < len(run.steps)).all())
        assert all(0 <= r["step"] < len(run.steps) for r in result.evictions(turn))


def test_shared_sessions_do_not_leak_later_turns_into_earlier_timelines(lm):
    result = run_policy(lm, ["Say hello.", "Say goodbye.", "Say thanks."], RunSettings(H2O(), 0.9, "decode"),
                        max_new_tokens=6)
    for turn, run in enumerate(result.turns):
        steps = result.eviction_steps(turn)
        assert bool(((steps == NEVER) | (steps < len(run.steps))).all()), turn


def test_a_fraction_that_keeps_nothing_is_refused_before_any_step(lm):
    run = CompressedSession(lm, RunSettings(H2O(), 0.001, "decode"))
    with pytest.raises(KvvizError, match="keeps no slot"):
        run.add_turn("Hi.")
    with pytest.raises(KvvizError, match="fewer than 16 bits"):
        Kivi(key_bits=16)
    assert torch.is_tensor(run.running)


def test_after_steps_compresses_as_kvpress_decoding_press_schedules_it(lm):
    """Mode after_steps (kvpress' DecodingPress, compression_interval 3, target_size 20): the prompt stays whole
    until 3 decode steps are done, then the cache is cut to 20 after every third step; in between it grows by one
    a step. Counted per layer and KV head from what each step saw."""
    run = CompressedSession(lm, RunSettings(KeyDiff(), 20, "after_steps", 3))
    run.add_turn(PROMPT)
    prompt = len(run)
    for step in range(10):
        run.step()
        counts = run.seen.sum(-1)  # (L, KV): slots the step saw besides its own
        expected = prompt + step if step < 3 else 20 + step % 3
        assert bool((counts == expected).all()), (step, counts.unique().tolist(), expected)
