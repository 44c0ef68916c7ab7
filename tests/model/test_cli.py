"""``python -m kvviz chat`` and ``whatif`` as a user runs them (``kvviz.cli.main`` in this process, the real bundled
model): JSON fields, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import re

import pytest
from tests.support.cli import cli


def test_chat_json_document():
    result = cli("chat", "--turn", "Hi!", "--turn", "What is 2+2?", "--max-new-tokens", "5", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) >= {"model", "device", "tokens", "pending", "turns", "cache_length"}
    assert doc["cache_length"] == len(doc["tokens"])
    assert [t["slot"] for t in doc["tokens"]] == list(range(doc["cache_length"]))
    assert [t["position"] for t in doc["tokens"]] == list(range(doc["cache_length"]))
    segments = [t["segment"] for t in doc["tokens"]]
    assert segments[0] == "history" and "query" in segments and segments[-1] == "generated"
    assert segments == sorted(segments, key=["history", "query", "generated"].index)
    assert {t["turn"] for t in doc["tokens"] if t["segment"] == "history"} == {0}
    assert [t["user"] for t in doc["turns"]] == ["Hi!", "What is 2+2?"]
    assert doc["pending"] is not None and set(doc["pending"]) == {"id", "text"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--turn", "   "], "empty"),
        (["--turn", "hi", "--model", "/no/such/model"], "does not exist"),
        (["--turn", "word " * 9000], "context window"),
        (["--turn", "hi", "--max-new-tokens", "0"], "at least 1"),
    ],
)
def test_bad_input_is_one_line_without_traceback(args, message):
    result = cli("chat", *args)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert message in lines[-1]


def test_whatif_json_document():
    result = cli("whatif", "--turn", "a = 3, b = 5. What is a + b?", "--max-new-tokens", "4", "--evict", "3,5-9",
                 "--bits-for", "10-12=4", "--layer", "2", "--head", "5", "--topk", "3", "--continue", "4", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) >= {"tokens", "at", "edit", "next_token", "heads", "detail", "memory", "continuation"}
    assert doc["at"] == len(doc["tokens"]) - 1
    assert doc["edit"]["evict"][0]["slots"] == [3, 5, 6, 7, 8, 9] and doc["edit"]["key_bits"]["11"] == 4
    assert len(doc["next_token"]["full"]) == 3 and set(doc["next_token"]["full"][0]) >= {"id", "text", "prob", "rank_other"}
    assert {"kl", "tv", "top1_changed"} <= set(doc["next_token"])
    assert len(doc["heads"]["rho"]) == 30 and len(doc["heads"]["rho"][0]) == 9
    assert set(doc["heads"]) >= {"rho", "delta_isolated", "delta_propagated"}
    detail = doc["detail"]
    assert (detail["layer"], detail["head"]) == (2, 5) and detail["alpha_renorm"][3] is None
    assert len(detail["slots"]) == len(detail["alpha_full"]) == len(detail["alpha_edited"]) == doc["at"] + 1
    assert doc["memory"]["edited_bytes"] < doc["memory"]["full_bytes"] and doc["memory"]["fp16_bytes"] > 0
    assert set(doc["continuation"]) >= {"full", "edited", "first_divergence"}


def test_whatif_policy_and_bad_input():
    result = cli("whatif", "--turn", "Hello there", "--max-new-tokens", "2", "--policy", "h2o", "--budget", "8")
    assert result.returncode == 0, result.stderr and "KL" in result.stdout
    for args, message in ((["--evict", "1-x"], "bad slot list"), (["--bits", "five"], "bit-width"),
                          (["--bits", "4", "--group-size", "5"], "does not divide"),
                          (["--policy", "nope", "--budget", "3"], "--policy needs")):
        result = cli("whatif", "--turn", "Hello there", "--max-new-tokens", "2", *args)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert message in result.stderr.strip().splitlines()[-1]


def test_whatif_text_names_the_first_divergence_in_words():
    result = cli("whatif", "--turn", "Hello there", "--max-new-tokens", "2", "--evict", "1", "--continue", "3")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("first divergence: "))
    assert re.fullmatch(r"first divergence: (none \(the same tokens\)|token \d+)", line), line
