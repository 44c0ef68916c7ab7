"""The Sweeps tab under AppTest shows a damaged folder's good rows and names each bad one."""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.policies.base import Ratio
from kvviz.sweeps import SweepSpec
from tests.support.sweeps import fake_row, folder_with

ROOT = Path(__file__).resolve().parents[2]


def test_the_app_shows_the_good_rows_and_names_each_bad_one(folder_spec, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.support.app_test import open_view

    cases = SweepSpec(folder_spec.prompts, ("h2o", "streaming_llm"), (8, Ratio(0.5)), max_new_tokens=6).cases()
    good = [fake_row(case, 0.1 * (i + 1)) for i, case in enumerate(cases[:5])]
    bad = [{**fake_row(cases[5]), "ratio": 1.5}, {**fake_row(cases[6]), "every": "abc"},
           {**fake_row(cases[7]), "turns": "not json"}]
    folder = folder_with(tmp_path, [(json.dumps(r) + "\n").encode() for r in good[:2]] + [b"{torn\n"]
                         + [(json.dumps(r) + "\n").encode() for r in [*bad, *good[2:]]])
    before = (folder / "rows.jsonl").read_bytes()
    monkeypatch.setenv("KVVIZ_SWEEPS", str(folder))
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300).run()
    open_view(app, "Sweeps")
    app.segmented_control(key="sweep-source").set_value("Open a sweep's table").run()
    next(s for s in app.selectbox if s.label.startswith("Sweep on this server")).select(str(folder)).run()
    assert not app.exception and not [e.value for e in app.error]
    warnings = [w.value.replace("\\", "") for w in app.warning]
    path = folder / "rows.jsonl"
    assert [w for w in warnings if w.startswith("Left out: ")] == [
        f"Left out: {path}:3: not JSON (Expecting property name enclosed in double quotes)",
        f"Left out: {path}:4: a compression ratio must be in [0, 1), got 1.5",
        f"Left out: {path}:5: every must be a whole number of at least 1, not 'abc'",
        f"Left out: {path}:6: turns is not JSON (a list of the prompt's texts): 'not json'"]
    assert any(c.value.startswith("5 cases, the worst first") for c in app.caption)
    case = next(s for s in app.selectbox if s.key == "sweep-case")
    worst = max(good, key=lambda r: r["kl_mean"])
    assert len(case.options) == 5 and f"KL {worst['kl_mean']:.4f}" in case.format_func(0)
    assert (folder / "rows.jsonl").read_bytes() == before and sorted(p.name for p in folder.iterdir()) == ["rows.jsonl"]
