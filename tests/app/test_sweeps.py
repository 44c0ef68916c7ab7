"""Sweeps in the page under AppTest: a case opened as a policy run, and a sweep run from the tab whose rows are the
command line's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvviz.sweeps import load_prompts, records, run_cases, run_sweep

ROOT = Path(__file__).resolve().parents[2]


def test_the_app_opens_a_sweep_case_as_a_policy_run(sweep_spec, one_by_one, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.support.app_test import open_view

    run_sweep(sweep_spec, tmp_path, progress=False)
    monkeypatch.setenv("KVVIZ_SWEEPS", str(tmp_path))
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300).run()
    open_view(app, "Sweeps")
    app.segmented_control(key="sweep-source").set_value("Open a sweep's table").run()
    next(s for s in app.selectbox if s.label.startswith("Sweep on this server")).select(str(tmp_path)).run()
    assert not app.exception and not [e.value for e in app.error]
    assert any(c.value.startswith("8 cases, the worst first") for c in app.caption)
    worst = max(one_by_one, key=lambda r: r["kl_mean"])
    case = next(s for s in app.selectbox if s.key == "sweep-case")
    assert case.value == 0 and f"KL {worst['kl_mean']:.4f}" in case.format_func(0)
    app.button(key="sweep-open").click().run()
    assert not app.exception
    result = app.session_state["policy_run"]
    assert [t.user for t in result.turns] == json.loads(worst["turns"])
    assert result.settings.label.startswith(worst["policy"])
    assert result.last.policy_text == worst["policy_text"] and result.last.full_text == worst["full_text"]
    assert any("as a policy run" in i.value for i in app.info)
    assert app.session_state["view"] == "Policy run" and not app.exception  # the page opened that tab
    assert any(s.label == "Turn to look into" for s in app.selectbox)


def test_the_app_runs_a_sweep_whose_rows_are_the_clis(lm):
    """The Sweeps tab runs a sweep on the page's model (a built-in set, policies, budgets, cache formats — the model's
    own and NVFP4 written slot by slot —, reply length): its rows
    are those of ``run_cases`` (what
    ``python -m kvviz sweep`` writes) for the same cases, the table lists them worst first and its worst case opens
    as a policy run; a form with no policy is refused in one line and keeps the sweep shown."""
    from streamlit.testing.v1 import AppTest

    from kvviz.sweeps.cases import cases_for
    from tests.support.app_test import open_view

    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=600).run()
    open_view(app, "Sweeps")
    app.selectbox(key="sweep-prompts").select("builtin:kv")
    app.number_input(key="sweep-limit").set_value(1)
    app.multiselect(key="sweep-policies").set_value(["h2o", "streaming_llm"])
    app.multiselect(key="sweep-budgets").set_value([0.25])
    app.number_input(key="sweep-new-tokens").set_value(4)
    app.multiselect(key="sweep-caches").set_value(["16 bits (as computed)", "nvfp4"])
    app.button(key="FormSubmitter:sweep-run-Run the sweep").click().run()
    assert not app.exception and not [w.value for w in app.warning], [w.value for w in app.warning]
    shown = app.session_state["page_sweep"].table
    reference = run_cases(lm, cases_for(load_prompts("builtin:kv", 1), ["h2o", "streaming_llm"],
                                                      [0.25], "decode", 1, 4, [None, "nvfp4"]), batch=4)
    assert len(reference) == 4 and {row["scheme"] for row in reference} == {"fp16", "nvfp4"}
    assert sorted(shown["key"]) == sorted(row["key"] for row in reference)
    for row in reference:
        here = records(shown[shown["key"] == row["key"]])[0]
        assert here["policy_text"] == row["policy_text"] and here["divergence"] == row["divergence"]
        assert here["kl_mean"] == pytest.approx(row["kl_mean"], rel=1e-6, abs=1e-9)  # the same batched passes
    assert any(c.value.startswith("4 cases, the worst first") for c in app.caption)
    assert any("The sweep ran 4 cases" in i.value for i in app.info)
    app.multiselect(key="sweep-policies").set_value([])
    app.button(key="FormSubmitter:sweep-run-Run the sweep").click().run()
    assert any("choose at least one policy" in w.value for w in app.warning)
    assert len(app.session_state["page_sweep"].table) == 4  # the sweep shown is kept
    app.button(key="sweep-open").click().run()
    assert not app.exception and app.session_state["view"] == "Policy run"
