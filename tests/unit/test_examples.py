"""There is an example notebook for each of the three jobs, and a marimo one."""

from __future__ import annotations

from pathlib import Path


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


def test_there_is_an_example_per_job():
    assert {p.stem for p in NOTEBOOKS} >= {"explore", "debug_policy", "compare_schemes"}
    assert (EXAMPLES / "explore_marimo.py").exists()
