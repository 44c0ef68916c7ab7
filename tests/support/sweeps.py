"""What the sweep tests share: two prompts, the sweep over them (``sweep_spec``) and its reference rows, each case's
policy run done on its own (``one_by_one``, once per test process: it runs the model 8 times), how two rows are
compared, and made-up rows for the folder tests (no model runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvviz.policies.base import Ratio
from kvviz.sweeps import SweepSpec
from kvviz.sweeps.cases import Case, run_cases
from tests.support.rounding import kl_rounding

PROMPTS = [{"id": "capital", "prompt": "The capital of France is Paris. What is the capital of France?",
            "expected": "Paris"},
           {"id": "sum", "turns": ["Remember: a = 3, b = 5.", "What is a + b?"], "expected": "8"}]


def prompts_file(folder: Path, blank_line: bool = False) -> str:
    """:data:`PROMPTS` as a JSONL file in ``folder`` (``blank_line``: one more at its end, as editors leave one)."""
    path = folder / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n" + "\n" * blank_line)
    return str(path)


@pytest.fixture(scope="session")
def sweep_spec(tmp_path_factory) -> SweepSpec:
    """Two policies × budgets 8 and 0.5 × the two prompts: 8 cases, 6 new tokens each."""
    return SweepSpec(prompts_file(tmp_path_factory.mktemp("prompts"), blank_line=True), ("h2o", "streaming_llm"), (8, 0.5),
                     max_new_tokens=6)


@pytest.fixture(scope="session")
def one_by_one(lm, sweep_spec) -> list[dict]:
    """The reference: each case's policy run, done on its own (its own full-cache run too), one step at a time."""
    return [run_cases(lm, [case], batch=0)[0] for case in sweep_spec.cases()]


def same_rows(eps: float, rows: list[dict], reference: list[dict]) -> None:
    """Row by row: what is exact (texts, tokens, steps, flags, top-1 agreement) equal; the KLs to the float32 rounding
    of another summation order — another thread count in other processes, or another batch shape when a prompt's
    cases decode as one batch (tests/support/rounding.py: ε_z ≈ 1.4e-3, |ΔKL| ≤ ε_z·(2·KL + 4); a mean or a max of KLs is
    bounded by the same at its own value). Tokens and top-1 agreement could differ only where two logits lie within
    2·ε_z of each other; the greedy replies of these prompts have no such near-tie."""
    assert [r["key"] for r in rows] == [r["key"] for r in reference]
    for row, ref in zip(rows, reference):
        for name, value in ref.items():
            if name in ("kl_mean", "kl_max"):
                assert abs(row[name] - value) <= kl_rounding(eps, value), name
            else:
                assert row[name] == value, name


@pytest.fixture
def folder_spec(tmp_path) -> SweepSpec:
    """Two policies × budget 8 × the two prompts, 6 new tokens: the folder tests' sweep (its rows made up)."""
    return SweepSpec(prompts_file(tmp_path), ("h2o", "streaming_llm"), (8,), max_new_tokens=6)


def fake_row(case: Case, kl: float = 0.1) -> dict:
    """A row as :func:`~kvviz.sweeps.cases.run_cases` writes one, with made-up measures."""
    return {"key": case.key, "prompt_id": case.prompt.id, "family": case.prompt.family, "policy": case.policy,
            "budget": case.budget, "fraction": isinstance(case.budget, float),
            "ratio": case.budget.ratio if isinstance(case.budget, Ratio) else None, "mode": case.mode,
            "every": case.every, "max_new_tokens": case.max_new_tokens, "scheme": case.scheme or "fp16",
            "prompt_slots": 20, "steps": 3, "kl_mean": kl, "kl_max": 2 * kl, "top1_agreement": 1.0,
            "divergence": None, "answer_changed": False, "expected": case.prompt.expected, "full_match": True,
            "policy_match": True, "full_text": "Paris", "policy_text": "Paris",
            "turns": json.dumps(list(case.prompt.turns))}


def lines_of(spec: SweepSpec) -> list[bytes]:
    """Each case's row as a line of rows.jsonl (newline included)."""
    return [(json.dumps(fake_row(case, 0.1 * (i + 1))) + "\n").encode() for i, case in enumerate(spec.cases())]


def folder_with(tmp_path: Path, lines: list[bytes]) -> Path:
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "rows.jsonl").write_bytes(b"".join(lines))
    return folder


def no_model(row: dict) -> None:
    raise AssertionError(f"a case ran: {row['key']}")


def table_keys(folder: Path) -> list[str]:
    return list(pd.read_csv(folder / "table.csv")["key"])
