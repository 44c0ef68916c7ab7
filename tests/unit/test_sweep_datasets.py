"""kvpress-format datasets and RULER-style sets without a model: RULER's metrics against their formulas, the
generated sets reproducible and holding their answers, bad rows refused with their row number."""

from __future__ import annotations

import json

import pytest

from kvviz.errors import KvvizError
from kvviz.sweeps import load_prompts
from kvviz.sweeps.ruler import SETS, metric_for, ruler_set, string_match


@pytest.mark.parametrize("prediction, answers, metric, score", [
    ("The numbers are 123 and 456.", ["123", "456", "789"], "string_match_all", 2 / 3),
    ("The numbers are 123 and 456.", ["123", "456", "789"], "string_match_part", 1.0),
    ("APPLE, Bridge", ["apple", "bridge"], "string_match_all", 1.0),  # case ignored, as RULER lowers both
    ("nothing here", ["x1"], "string_match_part", 0.0),
])
def test_ruler_string_match(prediction, answers, metric, score):
    # RULER: sum(r.lower() in pred.lower() for r in ref) / len(ref), or max(...) for string_match_part
    found = [answer.lower() in prediction.lower() for answer in answers]
    assert score == (sum(found) / len(found) if metric.endswith("all") else float(max(found)))
    assert string_match(prediction, answers, metric) == score
    assert metric_for("qa_squad") == "string_match_part" and metric_for("niah_multikey_2") == "string_match_all"


def test_the_generated_sets_are_reproducible_and_hold_their_answers():
    for name in SETS:
        prompts = ruler_set(name)
        assert prompts == ruler_set(name) and prompts
        for prompt in prompts:
            assert prompt.answers and prompt.metric == metric_for(prompt.family)
            assert all(answer in prompt.turns[0] for answer in prompt.answers), prompt.id  # in the first turn's text
    turn = ruler_set("multiturn")[0]
    assert len(turn.turns) == 2 and turn.answers[0] not in turn.turns[1]  # only turn 1 holds turn 2's answer
    assert len(load_prompts("builtin:ruler")) == sum(len(make()) for make in SETS.values())


@pytest.mark.parametrize("row, words", [
    ({"context": "c", "question": "q"}, "row 1: no 'answer' column"),
    ({"context": "", "question": "q", "answer": "a"}, "row 1: context must be a non-empty text"),
    ({"context": "c", "question": 3, "answer": "a"}, "row 1: question must be a text or a list"),
    ({"context": "c", "question": ["q1", "q2"], "answer": ["a"]}, r"row 1: answer must be .* \(one per question\)"),
    ({"context": "c", "question": "q", "answer": "a", "max_new_tokens": 0},
     r"max_new_tokens must be in \[1, 4096\], got 0"),
])
def test_bad_dataset_rows_are_refused_with_their_row(tmp_path, row, words):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(KvvizError, match=words):
        load_prompts(str(path))
