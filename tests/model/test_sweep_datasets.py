"""A kvpress-format parquet swept on the bundled model, each reply scored by its task's metric."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvviz.sweeps import SweepSpec, load_prompts, run_sweep
from kvviz.sweeps.ruler import ruler_set, string_match


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A kvpress-format parquet: two questions on one context (a list) and a qa row, answers as lists."""
    needle = ruler_set("niah_multikey")[0]
    context, question = needle.turns[0].split("\n\nWhat is")
    rows = [{"context": context + "\n\n", "question": ["What is" + question, "Repeat the first sentence."],
             "answer": [list(needle.answers), ["the"]], "answer_prefix": "Answer:", "task": "niah_multikey",
             "max_new_tokens": 6},
            {"context": "Paris is the capital of France. ", "question": ["What is the capital of France?"],
             "answer": [["Paris", "paris, france"]], "answer_prefix": "", "task": "qa_capital", "max_new_tokens": 5}]
    path = tmp_path_factory.mktemp("kvpress") / "data.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path, rows


def test_a_kvpress_dataset_sweeps_with_its_tasks_metric(dataset, tmp_path):
    path, rows = dataset
    prompts = load_prompts(str(path))
    assert [p.id for p in prompts] == ["niah_multikey-1-q1", "niah_multikey-1-q2", "qa_capital-2-q1"]
    assert prompts[0].turns[0].startswith(rows[0]["context"]) and prompts[0].max_new_tokens == 6
    assert prompts[2].metric == "string_match_part" and prompts[0].metric == "string_match_all"
    table = run_sweep(SweepSpec(str(path), ("streaming_llm",), (0.5,), max_new_tokens=32), tmp_path, progress=False)
    assert len(table) == 3 and set(table["max_new_tokens"]) == {6, 5}  # each row's own reply length
    for row in table.to_dict("records"):
        answers = json.loads(row["answers"])
        assert row["full_score"] == string_match(row["full_text"], answers, row["metric"])
        assert row["policy_score"] == string_match(row["policy_text"], answers, row["metric"])
