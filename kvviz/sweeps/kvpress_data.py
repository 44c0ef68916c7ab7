"""kvpress' evaluation datasets as sweep prompts: a ``.parquet`` file or JSONL lines with kvpress' columns —
``context``, ``question``, ``answer`` (a text or a list of them), and optionally ``answer_prefix``, ``task``,
``max_new_tokens`` and ``id`` — as kvpress' ``DATASET_REGISTRY`` sets hold them (RULER, LongBench, …, exported to a
file: nothing is downloaded here).

Each row is one case: one user turn, the context followed by the question (kvpress' pipeline puts them in one user
message the same way), scored with its task's RULER metric (:func:`kvviz.sweeps.ruler.metric_for`) against its
answers; a row whose ``question`` is a list (with a list of answers, one each) is one case per question, sharing the
context. Where kvviz differs: kvpress compresses the context before the question is seen and forces ``answer_prefix``
as the reply's start; kvviz compresses the prompt it is given (context and question) at the run's mode, and the reply
starts freely (the prefix is not forced).
"""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.errors import KvvizError
from kvviz.numbers import number
from kvviz.sweeps.prompts import MAX_PROMPT_CHARS, Prompt, json_line, prompt_id, text_of
from kvviz.sweeps.ruler import metric_for

COLUMNS = ("context", "question", "answer")
OPTIONAL = ("answer_prefix", "task", "max_new_tokens", "id")


def is_kvpress_file(path: Path) -> bool:
    """A ``.parquet`` file, or JSONL whose first object has kvpress' ``context`` column."""
    if path.suffix == ".parquet":
        return True
    try:
        with path.open(encoding="utf-8") as handle:
            first = next((line for line in handle if line.strip()), "")
        return isinstance(item := json.loads(first), dict) and "context" in item
    except (OSError, ValueError, RecursionError):  # not UTF-8, not JSON: read (and refused) as kvviz's JSONL
        return False


def read_kvpress(path: Path) -> list[Prompt]:
    """The cases of a kvpress-format file (each refused with its row number when a column is missing or wrong)."""
    rows = _rows(path)
    prompts = []
    for index, row in enumerate(rows, start=1):
        prompts += _cases(row, f"{path} row {index}", index)
    return prompts


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise KvvizError(f"dataset file {path} does not exist")
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            table = pd.read_parquet(path)
        except Exception as exc:
            raise KvvizError(f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})") from None
        return table.to_dict("records")
    lines = text_of(path.read_bytes(), str(path)).split("\n")
    return [json_line(line, f"{path}:{index}") for index, line in enumerate(lines, start=1) if line.strip()]


def _texts(value: object) -> list[str] | None:
    """A text or a list-like of texts (a parquet list column comes as an array) as a list; None otherwise."""
    if isinstance(value, str):
        return [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _answers(value: object) -> list[str] | None:
    """The reference answers of one question, each a non-empty text (an empty one is in every reply: RULER's string
    match would score any reply 1.0); None otherwise."""
    texts = _texts(value)
    return texts if texts is not None and all(text.strip() for text in texts) else None


def _cases(row: object, where: str, row_number: int) -> list[Prompt]:
    if not isinstance(row, dict):
        raise KvvizError(f"{where}: a row must be an object with {', '.join(COLUMNS)}")
    missing = [column for column in COLUMNS if column not in row]
    if missing:
        raise KvvizError(f"{where}: no {missing[0]!r} column (kvpress' columns: {', '.join(COLUMNS + OPTIONAL)})")
    context, task = row["context"], row.get("task") or "kvpress"
    if not isinstance(context, str) or not context.strip() or not isinstance(task, str):
        raise KvvizError(f"{where}: context must be a non-empty text and task a text")
    questions = _texts(row["question"])
    if questions is None:
        raise KvvizError(f"{where}: question must be a text or a list of texts")
    listed = not isinstance(row["question"], str)  # a list of questions: a list of answers, one each
    answer = row["answer"].tolist() if hasattr(row["answer"], "tolist") else row["answer"]
    answers = list(answer) if listed and isinstance(answer, (list, tuple)) else [answer]
    if len(answers) != len(questions) or any(_answers(a) is None for a in answers):
        raise KvvizError(f"{where}: answer must be a non-empty text or a list of them (one per question)")
    limit = row.get("max_new_tokens")
    if limit is not None and limit == limit:  # NaN: a parquet column where this row has none
        if isinstance(limit, str):  # number() would read text as a number
            raise KvvizError(f"{where}: max_new_tokens must be an integer in [1, 4096], got {limit!r:.40}")
        limit = number(limit, f"{where}: max_new_tokens", 1, 4096, integer=True)
    else:
        limit = None
    ident = prompt_id(row.get("id"), where, f"{task}-{row_number}")
    cases = []
    for index, (question, answer) in enumerate(zip(questions, answers)):
        text = context + question
        if len(text) > MAX_PROMPT_CHARS:
            raise KvvizError(f"{where}: over {MAX_PROMPT_CHARS:,} characters")
        name = ident if not listed else f"{ident}-q{index + 1}"
        cases.append(Prompt(name, (text,), None, task, tuple(_answers(answer)), metric_for(task), limit))
    return cases
