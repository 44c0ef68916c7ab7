"""Quantization schemes by name (kvviz.schemes.catalogue) and their comparison at one step (quant-compare).

References: transformers' QuantizedCache's schedule as a policy run reproduces it (tests/model/test_quanto_cache.py
checks that run against transformers itself), and the policy run's own step logits with that cache. Tolerances: the
what-if and the run compute the same step on the same stored K/V with different summation orders, so their
probabilities agree within (e^{2ε} − 1)·p, ε the logits' float32 rounding (tests/support/rounding.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.cli import main
from kvviz.errors import KvvizError
from kvviz.runs.compressed import CompressedSession, RunSettings
from kvviz.schemes.quanto import QuantoCache
from kvviz.schemes.catalogue import Scheme, quanto_prefix, schemes
from kvviz.session import Session
from kvviz.whatif import what_if
from kvviz.schemes.compare import compare_schemes
from tests.support.rounding import kl_rounding, probability_rounding

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"
NAMES = ["fp16", "int4-token", "int2-channel", "kivi-2", "fp8-e4m3-head", "fp8-e5m2-tensor", "quanto-4"]


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, steps=4)


def test_a_16_bit_scheme_changes_nothing_and_every_row_is_its_what_if(chat):
    rows = compare_schemes(chat, schemes(NAMES))
    assert [r.scheme for r in rows] == NAMES
    identity = rows[0]
    assert identity.kl == 0 and identity.tv == 0 and not identity.top1_changed and identity.delta_o == 0
    assert identity.bytes == identity.full_bytes and identity.quantized == 0
    at, passes = len(chat) - 1, [e.added for e in chat.transcript.growth]
    for row in rows[1:]:
        result = what_if(chat, Scheme(row.scheme).edit(passes, at), at, topk=5)
        assert (row.kl, row.tv, row.bytes) == (result.next_token.kl, result.next_token.tv, result.memory.edited_bytes)
        norm = float(result.heads["delta_isolated"].double().square().sum().sqrt())
        assert row.delta_o == norm
    kivi = rows[NAMES.index("kivi-2")]
    assert kivi.quantized == 0 and kivi.kl == 0  # a short chat is all inside KIVI's 128 full-precision slots
    assert all(r.kl > 0 and r.bytes < r.full_bytes for r in rows if r.scheme not in ("fp16", "kivi-2"))


def test_quanto_prefix_follows_a_quantized_cache_runs_flushes(lm):
    """The flush rule replayed from the growth log equals the one a QuantizedCache run applied (two turns, a small
    residual so that flushes happen in decode steps and at the second prompt)."""
    quanto = QuantoCache(4, 64, 6)
    run = CompressedSession(lm, RunSettings(cache_format=quanto))
    run.add_turn(PROMPT)
    for _ in range(9):
        run.step()
    run.add_turn("And my dog?")
    for _ in range(3):
        run.step()
    passes = [e.added for e in run.session.transcript.growth]
    flushed = sorted({upto for _, upto in run.timeline.flushes})
    assert len(flushed) >= 3
    for at in range(1, len(run.session) + 1):
        assert quanto_prefix(passes, at, quanto.residual_length) == max([u for u in flushed if u <= at], default=0), at


def test_the_quanto_scheme_holds_what_a_quantized_cache_holds_at_that_step(lm, chat, eps):
    """At the first decode step, where both hold the prompt's K/V as computed and QuantizedCache has quantized them
    once (later steps of a run see K/V computed on a quantized cache; a what-if keeps the full run's K/V)."""
    run = CompressedSession(lm, RunSettings(cache_format=QuantoCache(4)))
    run.add_turn(PROMPT)
    at = len(run.session)
    run.step(chat.transcript.ids[at])
    assert run.session.transcript.ids == chat.transcript.ids[:at + 1]
    result = what_if(chat, Scheme("quanto-4").edit([e.added for e in chat.transcript.growth], at), at, topk=5)
    assert sorted(result.edit.key_bits) == list(range(at))  # the prompt, quantized as soon as it was prefilled
    assert result.next_token.kl > 1e-4  # the scheme does change this step
    reference = torch.softmax(run.session.logits.double(), -1)
    bound = probability_rounding(eps)
    for candidate in result.next_token.edited:
        p = float(reference[candidate.id])
        assert abs(candidate.prob - p) <= bound * p + 1e-12, candidate


def test_quant_compare_prints_one_row_per_scheme(capsys):
    code = main(["quant-compare", "--turn", PROMPT, "--max-new-tokens", "3", "--scheme", "fp16",
                 "--scheme", "fp8-e4m3-head", "--scheme", "quanto-2", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["scheme"] for r in doc["rows"]] == ["fp16", "fp8-e4m3-head", "quanto-2"]
    for field in ("kl", "tv", "top1_changed", "bytes", "delta_o", "weight_term", "content_term"):
        assert field in doc["rows"][1]
    assert doc["rows"][0]["kl"] == 0 and doc["rows"][2]["kl"] > doc["rows"][1]["kl"]


def test_a_scheme_the_model_cannot_take_is_refused_and_changes_nothing(lm):
    """quanto's groups of 64 channels do not divide a tiny Qwen3's 16-channel heads: refused before any scheme
    runs, the session as it was."""
    from kvviz.tiny_sessions import tiny_pair

    _, _, session = tiny_pair("qwen3", lm.tokenizer, ["hello there"], new_tokens=3)
    version, length = session.version, len(session)
    with pytest.raises(KvvizError, match="group size 64 does not divide the head dimension 16"):
        compare_schemes(session, schemes(["fp16", "quanto-4"]))
    assert (session.version, len(session)) == (version, length)
    row = compare_schemes(session, schemes(["fp8-e4m3-head"]))[0]  # a scheme it can take runs on every slot before
    assert row.quantized == len(session) - 1 and row.bytes < row.full_bytes and row.kl >= 0 and row.delta_o > 0


def test_whatif_takes_a_scheme_as_its_quantization(capsys):
    turn = ["--turn", PROMPT, "--max-new-tokens", "3", "--json"]
    assert main(["whatif", *turn, "--scheme", "fp8-e5m2-tensor"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(["quant-compare", *turn, "--scheme", "fp8-e5m2-tensor"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert alone["next_token"]["kl"] == row["kl"] and alone["memory"]["edited_bytes"] == row["bytes"]
    assert main(["whatif", *turn, "--scheme", "kivi-2", "--bits", "4"]) == 2
    assert "--scheme says how every slot is stored" in capsys.readouterr().err


def test_a_sweep_takes_cache_schemes_as_an_axis(lm, eps, tmp_path):
    """Each scheme's row is the policy run with that cache done on its own (the KL to the rounding of another batch
    shape: the sweep's full run decodes beside the fp16 row, tests/support/rounding.py); a row opens as its case again."""
    from kvviz.policies import POLICIES
    from kvviz.runs.policy_run import run_policy
    from kvviz.sweeps import SweepSpec, records, run_sweep
    from kvviz.sweeps.cases import case_of

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "cat", "prompt": PROMPT, "expected": "Whiskers"}) + "\n")
    spec = SweepSpec(str(prompts), ("streaming_llm",), (16,), max_new_tokens=4, schemes=("fp16", "quanto-2"))
    rows = records(run_sweep(spec, tmp_path / "out", progress=False))
    assert [r["scheme"] for r in rows] == ["fp16", "quanto-2"] and len({r["key"] for r in rows}) == 2
    alone = run_policy(lm, [PROMPT], RunSettings(POLICIES["streaming_llm"](), 16, cache_format=QuantoCache(2)), 4).last
    kls = [step.kl for step in alone.records]  # one per reply token, the prompt's last row (step -1) first
    mean = sum(kls) / len(kls)
    assert abs(rows[1]["kl_mean"] - mean) <= kl_rounding(eps, mean) and rows[1]["policy_text"] == alone.policy_text
    assert rows[1]["kl_mean"] != rows[0]["kl_mean"]
    assert case_of(rows[1]).scheme == "quanto-2" and case_of(rows[0]).scheme is None
    with pytest.raises(KvvizError, match="int2-channel is not a cache a run writes slot by slot"):
        run_sweep(SweepSpec(str(prompts), ("streaming_llm",), (16,), schemes=("int2-channel",)), tmp_path / "x",
                  progress=False)
