"""Sweeps: the rows equal the policy runs done one by one; a killed sweep resumes to the full table without
duplicates; a rerun with more cases adds only those, one with other result settings or prompt texts is refused; a
local process pool and a local Ray instance give the same rows; prompt files are checked line by
line. On the bundled model (short prompts, short replies)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from kvviz.errors import KvvizError
from kvviz.sweeps import SweepSpec, load_prompts, read_table, records, run_cases, run_sweep
from kvviz.sweeps.prompts import builtin
from tests.support.rounding import kl_rounding

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [{"id": "capital", "prompt": "The capital of France is Paris. What is the capital of France?",
            "expected": "Paris"},
           {"id": "sum", "turns": ["Remember: a = 3, b = 5.", "What is a + b?"], "expected": "8"}]


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> SweepSpec:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n\n")
    return SweepSpec(str(path), ("h2o", "streaming_llm"), (8, 0.5), max_new_tokens=6)


@pytest.fixture(scope="module")
def one_by_one(lm, spec) -> list[dict]:
    """The reference: each case's policy run, done on its own (its own full-cache run too), one step at a time."""
    return [run_cases(lm, [case], batch=0)[0] for case in spec.cases()]


def test_a_sweep_gives_the_rows_of_the_runs_done_one_by_one(eps, spec, one_by_one, tmp_path):
    table = run_sweep(spec, tmp_path, progress=False)  # a prompt's 4 cases decoded as one batch
    _same(eps, records(table), one_by_one)
    assert len(one_by_one) == 8 and len({row["key"] for row in one_by_one}) == 8
    assert records(read_table(tmp_path)) == records(table)  # from table.parquet
    assert json.loads((tmp_path / "manifest.json").read_text())["settings"] == {
        "model": None, "mode": "decode", "every": 1, "max_new_tokens": 6, "extra": {}}
    row = one_by_one[0]
    assert 0 <= row["top1_agreement"] <= 1 and row["kl_max"] >= row["kl_mean"] >= 0
    assert row["answer_changed"] == (row["full_text"] != row["policy_text"]) or row["divergence"] is not None


def test_a_killed_sweep_resumes_to_the_full_table_without_duplicates(eps, spec, one_by_one, tmp_path):
    command = [sys.executable, "-m", "kvviz", "sweep", "--prompts", spec.prompts, "--policy", "h2o", "--policy",
               "streaming_llm", "--budget", "8", "--budget", "0.5", "--max-new-tokens", "6", "--out", str(tmp_path),
               "--no-progress"]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rows = tmp_path / "rows.jsonl"
    deadline = time.monotonic() + 300
    while (not rows.is_file() or rows.read_text().count("\n") < 3) and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = rows.read_text().count("\n")
    assert 3 <= written < 8
    with rows.open("a") as handle:  # as if killed in the middle of a line
        handle.write('{"key": "torn')
    table = run_sweep(spec, tmp_path, progress=False)
    _same(eps, records(table), one_by_one)  # the first rows come from the killed process
    keys = [json.loads(line)["key"] for line in rows.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 8


def test_a_sweep_grows_by_the_cases_it_lacks(eps, spec, one_by_one, tmp_path):
    run_sweep(replace(spec, policies=("h2o",), budgets=(8,), limit=1), tmp_path, progress=False)
    first = (tmp_path / "rows.jsonl").read_text()
    manifest = tmp_path / "manifest.json"  # as the version before growing sweeps wrote it: read the same way
    manifest.write_text(json.dumps({"format": "kvviz-sweep/2", "spec": asdict(spec), "cases": 1}))
    ran: list[str] = []
    table = run_sweep(spec, tmp_path, progress=False, on_row=lambda row: ran.append(row["key"]))
    assert ran == [row["key"] for row in one_by_one[1:]]  # only the missing cases ran
    assert (tmp_path / "rows.jsonl").read_text().startswith(first)
    _same(eps, records(table), one_by_one)
    ran.clear()
    narrower = replace(spec, policies=("streaming_llm",), budgets=(0.5,))
    table = records(run_sweep(narrower, tmp_path, progress=False, on_row=lambda row: ran.append(row["key"])))
    assert ran == []  # the whole table stays, this run's cases first
    assert [r["key"] for r in table] == [r["key"] for r in one_by_one if r["key"].split("|")[1:3] == [
        "streaming_llm", "0.5"]] + [r["key"] for r in one_by_one if r["key"].split("|")[1:3] != ["streaming_llm", "0.5"]]
    assert records(read_table(tmp_path)) == table


@pytest.mark.parametrize("change, words", [
    ({"max_new_tokens": 2}, "max_new_tokens 6 there, 2 here"),
    ({"mode": "prefill", "every": 4}, "mode 'decode' there, 'prefill' here; every 1 there, 4 here"),
    ({"model": "HuggingFaceTB/SmolLM2-360M-Instruct"}, "model None there, 'HuggingFaceTB/SmolLM2-360M-Instruct' here"),
])
def test_a_folder_with_other_result_settings_is_refused_and_kept(spec, tmp_path, change, words):
    small = replace(spec, policies=("h2o",), budgets=(8,), limit=1)
    run_sweep(small, tmp_path, progress=False)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    with pytest.raises(KvvizError, match=re.escape(words)):
        run_sweep(replace(small, **change), tmp_path, progress=False)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_a_prompt_id_with_other_text_is_refused(spec, tmp_path):
    run_sweep(replace(spec, policies=("h2o",), budgets=(8,), limit=1), tmp_path, progress=False)
    other = tmp_path.parent / f"{tmp_path.name}-other.jsonl"
    other.write_text(json.dumps({**PROMPTS[0], "expected": "Lyon"}) + "\n")
    with pytest.raises(KvvizError, match="another prompt with the id 'capital'"):
        run_sweep(replace(spec, prompts=str(other), policies=("h2o",), budgets=(8,)), tmp_path, progress=False)


def _same(eps: float, rows: list[dict], reference: list[dict]) -> None:
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


def test_a_local_process_pool_gives_the_same_rows(eps, spec, one_by_one, tmp_path):
    _same(eps, records(run_sweep(spec, tmp_path, workers=2, progress=False)), one_by_one)


def test_ray_tasks_on_a_local_instance_give_the_same_rows(eps, spec, one_by_one, tmp_path):
    ray = pytest.importorskip("ray")
    try:
        _same(eps, records(run_sweep(spec, tmp_path, workers=2, ray="local", progress=False)), one_by_one)
    finally:
        ray.shutdown()


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


def test_the_damage_chart_has_one_point_per_policy_and_budget(one_by_one):
    import pandas as pd

    from kvviz.figures import damage_chart

    chart = damage_chart(pd.DataFrame(one_by_one))
    assert len(chart.data) == 4 and set(chart.data["policy"]) == {"h2o", "streaming_llm"}
    first = chart.data.iloc[0]
    kls = sorted(r["kl_mean"] for r in one_by_one if r["policy"] == first["policy"] and r["budget"] == first["budget"])
    assert first["median"] == pytest.approx(sum(kls) / 2) and first["low"] <= first["median"] <= first["high"]


def test_the_app_opens_a_sweep_case_as_a_policy_run(spec, one_by_one, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.support.app_test import open_view

    run_sweep(spec, tmp_path, progress=False)
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


def test_an_uploaded_prompt_file_is_read_as_the_cli_reads_it(spec):
    from kvviz.sweeps.sources import uploaded_prompts

    data = Path(spec.prompts).read_bytes()
    assert uploaded_prompts("prompts.jsonl", data) == load_prompts(spec.prompts)
    assert [p.id for p in uploaded_prompts("prompts.jsonl", data, 1)] == ["capital"]
    with pytest.raises(KvvizError, match="not UTF-8"):
        uploaded_prompts("bad.jsonl", b"\xff\xfe")
    with pytest.raises(KvvizError, match="bad.jsonl:2: not JSON"):
        uploaded_prompts("bad.jsonl", data.replace(b"\n", b"\n{\n", 1))
    with pytest.raises(KvvizError, match="holds no prompts"):
        uploaded_prompts("empty.jsonl", b"\n\n")


def test_a_case_opened_again_keeps_its_cache_scheme(one_by_one):
    """A row of a sweep over cache schemes opens as a run with that scheme (the app's *Open as a policy run* once
    dropped it and ran the model's own cache)."""
    from kvviz.policies.user import available
    from kvviz.sweeps.cases import case_of, run_settings

    row = {**one_by_one[0], "scheme": "kivi-2"}
    settings = run_settings(case_of(row), available())
    assert settings.kivi is not None and settings.kivi.key_bits == 2 and settings.policy.name == row["policy"]
    quanto = run_settings(case_of({**row, "scheme": "quanto-4"}), available())
    assert quanto.quanto is not None and quanto.kivi is None
    assert run_settings(case_of({**row, "scheme": "fp16"}), available()).kivi is None
