"""``python -m kvviz chat`` as a user runs it: JSON fields, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvviz", *args], capture_output=True, text=True, timeout=300)


def test_chat_json_document():
    result = run("chat", "--turn", "Hi!", "--turn", "What is 2+2?", "--max-new-tokens", "5", "--json")
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
    result = run("chat", *args)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert message in lines[-1]
