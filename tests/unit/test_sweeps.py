"""Prompt files for sweeps, without a model: checked line by line, the built-in sets holding their answers, and an
uploaded file read as the command line reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvviz.errors import KvvizError
from kvviz.sweeps import load_prompts
from kvviz.sweeps.prompts import builtin


@pytest.mark.parametrize("line, words", [
    ("{not json", "line 2: not JSON"),
    ("[1, 2]", "line 2: a line must be a JSON object"),
    ('{"prompt": ""}', "line 2: the prompt or every turn must be a non-empty text"),
    ('{"prompt": "a", "turns": ["b"]}', "line 2: give exactly one of"),
    ('{"prompt": "a", "answer": "b"}', "line 2: unknown field 'answer'"),
    ('{"prompt": "a", "expected": 3}', "line 2: expected must be a non-empty text"),
])
def test_a_malformed_prompt_file_is_refused_with_the_line_number(tmp_path, line, words):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(KvvizError, match=words.replace("line 2", f"{path}:2").replace("[", r"\[")):
        load_prompts(str(path))


def test_the_builtin_sets_hold_their_answers_and_are_reproducible():
    for name in ("needle", "kv", "vars"):
        prompts = builtin(name)
        assert prompts == builtin(name) and len(prompts) >= 3
        for prompt in prompts:
            assert prompt.expected and prompt.expected in prompt.turns[-1] and prompt.family == name
    needle = builtin("needle")
    depths = [p.turns[0].index("secret code is") / len(p.turns[0]) for p in needle if p.id.startswith("needle-120")]
    assert depths == sorted(depths) and depths[0] < 0.2 < 0.8 < depths[-1]
    with pytest.raises(KvvizError, match="no built-in prompt set"):
        load_prompts("builtin:nothing")


def test_an_uploaded_prompt_file_is_read_as_the_cli_reads_it(sweep_spec):
    from kvviz.sweeps.sources import uploaded_prompts

    data = Path(sweep_spec.prompts).read_bytes()
    assert uploaded_prompts("prompts.jsonl", data) == load_prompts(sweep_spec.prompts)
    assert [p.id for p in uploaded_prompts("prompts.jsonl", data, 1)] == ["capital"]
    with pytest.raises(KvvizError, match="not UTF-8"):
        uploaded_prompts("bad.jsonl", b"\xff\xfe")
    with pytest.raises(KvvizError, match="bad.jsonl:2: not JSON"):
        uploaded_prompts("bad.jsonl", data.replace(b"\n", b"\n{\n", 1))
    with pytest.raises(KvvizError, match="holds no prompts"):
        uploaded_prompts("empty.jsonl", b"\n\n")
