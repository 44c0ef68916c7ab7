"""Why a slot went: a policy's decision, kept with its numbers, checked against a ranking written here (Python's
sort of the scores, ties to the earlier slot, protected ones to the later), a run's record of every eviction
checked against key norms computed here and the run's own timeline, and ``policy-run --why`` in this process."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.policies import H2O, KeyNorm, SnapKV, StreamingLLM
from kvviz.runs.compressed import RunSettings
from kvviz.runs.policy_run import run_policy
from kvviz.runs.timeline import NEVER
from kvviz.session import Session
from tests.support.cli import cli

PROMPT = "Rex is my dog and Tom is my cat. Which of them barks?"


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, generate=4)


def reference(scores: list[float], alive: list[bool], budget: int) -> tuple[set[int], float]:
    """The kept slots and the lowest kept score, by sorting: higher first; ties to the earlier slot, among +inf to
    the later one."""
    order = sorted((s for s in range(len(scores)) if alive[s]),
                   key=lambda s: (-scores[s], -s if scores[s] == float("inf") else s))
    kept = set(order[:budget])
    return kept, min(scores[s] for s in kept)


@pytest.mark.parametrize("policy", [SnapKV(), H2O(), StreamingLLM(sinks=4), KeyNorm()], ids=lambda p: p.name)
def test_a_decision_is_its_ranking_and_explains_each_slot(chat, policy):
    lm, at = chat.lm, len(chat) - 1
    decision = policy.decision(chat, 0.4, at)
    mask = policy.edit(chat, 0.4, at).evicted_mask(at, lm.layers, lm.kv_heads)
    assert torch.equal(decision.evicted, mask)  # the edit is the decision's
    for layer in range(lm.layers):
        for head in range(lm.kv_heads):
            scores = decision.scores[layer, head].tolist()
            kept, lowest = reference(scores, decision.alive[layer, head].tolist(), int(decision.budgets[layer, head]))
            assert {s for s in range(at) if not decision.evicted[layer, head, s]} == kept
            assert float(decision.threshold[layer, head]) == lowest
    for slot in (0, 5, at // 2, at - 1):
        rows = decision.why(slot)
        assert len(rows) == lm.layers * lm.kv_heads
        for row in rows:
            gone = bool(decision.evicted[row.layer, row.kv_head, slot])
            assert (row.outcome == "evicted") == gone
            assert (row.rank > row.budget) == gone and row.candidates == at
            assert row.score <= row.threshold if gone else row.score >= row.threshold
            if gone and row.score == row.threshold and row.score != float("inf"):
                assert "tied" in row.reason


def test_a_run_keeps_why_each_slot_went(lm):
    """Key norm in decode mode: each eviction's score is minus the norm of that slot's key (computed here in float64
    from the cache; float32 rounding of a 64-term sum and its root: |Δ| ≤ (D/2 + 1)·u·‖k‖ ≈ 2e-6·‖k‖), and its
    threshold is the lowest score among the slots the timeline shows kept after that decision."""
    result = run_policy(lm, [PROMPT], RunSettings(KeyNorm(), 24, "decode"), 6)
    turn = result.last
    session = turn.forced.session
    steps = result.eviction_steps()  # (L, KV, n): the decode step from which each slot is hidden
    norms = torch.stack([session.layer_kv(layer)[0].double().pow(2).sum(-1).sqrt()
                         for layer in range(lm.layers)])  # (L, KV, n)
    seen = 0
    for slot in sorted({row["slot"] for row in result.evictions()}):
        rows = result.why(slot)
        during = (steps[..., slot] >= 0) & (steps[..., slot] != NEVER)
        assert {(r["layer"], r["kv_head"]) for r in rows} == set(map(tuple, during.nonzero().tolist()))
        for row in rows:
            layer, head, step = row["layer"], row["kv_head"], row["step"]
            assert step == int(steps[layer, head, slot]) and row["outcome"] == "evicted"
            norm = float(norms[layer, head, slot])
            assert abs(row["score"] + norm) <= 33 * 2**-24 * norm
            at = turn.prompt_end + step
            kept = norms[layer, head, [s for s in range(at) if steps[layer, head, s] > step]]
            assert abs(row["threshold"] + float(kept.max())) <= 33 * 2**-24 * float(kept.max())
            assert row["margin"] <= 0 and row["budget"] == 24 and row["rank"] > 24
            seen += 1
    assert seen > 50  # decode mode evicts in many layers and KV heads
    assert result.why(len(session) - 1) == []  # the newest slot was never evicted


def test_policy_run_why_on_the_command_line():
    done = cli("policy-run", "--turn", PROMPT, "--policy", "snapkv", "--budget", "12", "--max-new-tokens", "3",
               "--why", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    gone = [e for e in report["evictions"] if e["slot"] == 2]
    rows = report["why"]["2"]
    assert rows and all(r["outcome"] == "evicted" and r["score"] <= r["threshold"] for r in rows)
    assert {r["step"] for r in rows} == {e["step"] for e in gone}
    refused = cli("policy-run", "--turn", PROMPT, "--policy", "snapkv", "--budget", "12", "--max-new-tokens", "2",
                  "--why", "9999")
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1 and "--why" in refused.stderr


def test_the_timeline_of_one_layer_and_kv_head_says_why_each_slot_went(lm):
    from kvviz import figures
    from kvviz.figures.policy_run_charts import why_row

    result = run_policy(lm, [PROMPT], RunSettings(KeyNorm(), 24, "decode"), 4)
    first = next(e for e in result.evictions() if e["layer"] is not None and e["kv_head"] is not None)
    layer, head, slot = first["layer"], first["kv_head"], first["slot"]
    n = len(result.last.forced.session)
    text = why_row(result, -1, layer, head, n)
    row = next(r for r in result.why(slot) if (r["layer"], r["kv_head"]) == (layer, head))
    assert text[slot].startswith(f"evicted before step {row['step']}: score {row['score']:.4g} < lowest kept")
    assert text[n - 1] == "kept to the end of the turn"
    pieces = [s.text for s in result.last.forced.session.transcript.slots]
    figure = figures.timeline(result, pieces, -1, layer, head)
    assert figure.data[0].customdata[slot][0] == text[slot]
    assert figures.timeline(result, pieces, -1, None, None).data[0].customdata is None  # all heads: shares only


def test_the_strip_says_why_the_seeding_policy_evicted_each_slot(make_chat, lm):
    from kvviz.edit.draft import EditDraft
    from kvviz.view_data import strip_chips, strip_reasons

    session = make_chat(PROMPT)
    at, policy = len(session) - 1, H2O()
    draft = EditDraft()
    draft.seed(policy.edit(session, 12, at), "h2o", policy.settings(), (policy, 12, at))
    decision = policy.decision(session, 12, at)
    reasons = strip_reasons(session, draft, 4, 7)  # query head 7 reads KV head 7 // 3 = 2
    evicted = sorted(draft.evicted_somewhere())
    assert sorted(reasons) == evicted
    for slot in evicted[:10]:
        row = next(r for r in decision.why(slot) if r.layer == 4 and r.kv_head == 2)
        assert f"layer 4, KV head 2: {row.outcome}" in reasons[slot] and row.reason in reasons[slot]
    chips = strip_chips(session, draft, at, 4, 7, reasons=reasons)
    assert chips[evicted[0]][17] == reasons[evicted[0]] and all(chip[17] == "" for chip in chips if chip[0] not in reasons)
    assert len(strip_reasons(session, draft, 4, None)[evicted[0]].splitlines()) == 1 + lm.kv_heads
    draft.clear()
    assert strip_reasons(session, draft, 4, 7) == {}
