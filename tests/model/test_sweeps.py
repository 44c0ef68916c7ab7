"""Sweeps on the bundled model: the rows equal the policy runs done one by one; a rerun with more cases adds only those,
one with other result settings or prompt texts is refused; the damage chart and a case opened again."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace

import pytest

from kvviz.errors import KvvizError
from kvviz.sweeps import read_table, records, run_sweep
from tests.support.sweeps import PROMPTS, same_rows


def test_a_sweep_gives_the_rows_of_the_runs_done_one_by_one(eps, sweep_spec, one_by_one, tmp_path):
    table = run_sweep(sweep_spec, tmp_path, progress=False)  # a prompt's 4 cases decoded as one batch
    same_rows(eps, records(table), one_by_one)
    assert len(one_by_one) == 8 and len({row["key"] for row in one_by_one}) == 8
    assert records(read_table(tmp_path)) == records(table)  # from table.parquet
    assert json.loads((tmp_path / "manifest.json").read_text())["settings"] == {
        "model": None, "mode": "decode", "every": 1, "max_new_tokens": 6, "extra": {}}
    row = one_by_one[0]
    assert 0 <= row["top1_agreement"] <= 1 and row["kl_max"] >= row["kl_mean"] >= 0
    assert row["answer_changed"] == (row["full_text"] != row["policy_text"]) or row["divergence"] is not None


def test_a_sweep_grows_by_the_cases_it_lacks(eps, sweep_spec, one_by_one, tmp_path):
    run_sweep(replace(sweep_spec, policies=("h2o",), budgets=(8,), limit=1), tmp_path, progress=False)
    first = (tmp_path / "rows.jsonl").read_text()
    manifest = tmp_path / "manifest.json"  # as the version before growing sweeps wrote it: read the same way
    manifest.write_text(json.dumps({"format": "kvviz-sweep/2", "spec": asdict(sweep_spec), "cases": 1}))
    ran: list[str] = []
    table = run_sweep(sweep_spec, tmp_path, progress=False, on_row=lambda row: ran.append(row["key"]))
    assert ran == [row["key"] for row in one_by_one[1:]]  # only the missing cases ran
    assert (tmp_path / "rows.jsonl").read_text().startswith(first)
    same_rows(eps, records(table), one_by_one)
    ran.clear()
    narrower = replace(sweep_spec, policies=("streaming_llm",), budgets=(0.5,))
    table = records(run_sweep(narrower, tmp_path, progress=False, on_row=lambda row: ran.append(row["key"])))
    assert ran == []  # the whole table stays, this run's cases first
    assert [r["key"] for r in table] == [r["key"] for r in one_by_one if r["key"].split("|")[1:3] == [
        "streaming_llm", "0.5"]] + [r["key"] for r in one_by_one if r["key"].split("|")[1:3] != ["streaming_llm", "0.5"]]
    assert records(read_table(tmp_path)) == table


@pytest.mark.parametrize("change, words", [
    ({"max_new_tokens": 2}, "max_new_tokens 6 there, 2 here"),
    ({"mode": "prefill", "every": 4}, "mode 'decode' there, 'prefill' here; every 1 there, 4 here"),
    ({"model": "FOLDER"}, "model None there, 'FOLDER' here"),  # the bundled model's converted folder, named
])
def test_a_folder_with_other_result_settings_is_refused_and_kept(sweep_spec, tmp_path, change, words):
    from kvviz.checkpoint import bundled_gguf, converted_dir

    if change.get("model") == "FOLDER":  # a model that exists (a missing one is refused before the folder is read)
        folder = str(converted_dir(bundled_gguf()))
        change, words = {"model": folder}, words.replace("FOLDER", folder)
    small = replace(sweep_spec, policies=("h2o",), budgets=(8,), limit=1)
    run_sweep(small, tmp_path, progress=False)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    with pytest.raises(KvvizError, match=re.escape(words)):
        run_sweep(replace(small, **change), tmp_path, progress=False)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_a_prompt_id_with_other_text_is_refused(sweep_spec, tmp_path):
    run_sweep(replace(sweep_spec, policies=("h2o",), budgets=(8,), limit=1), tmp_path, progress=False)
    other = tmp_path.parent / f"{tmp_path.name}-other.jsonl"
    other.write_text(json.dumps({**PROMPTS[0], "expected": "Lyon"}) + "\n")
    with pytest.raises(KvvizError, match="another prompt with the id 'capital'"):
        run_sweep(replace(sweep_spec, prompts=str(other), policies=("h2o",), budgets=(8,)), tmp_path, progress=False)


def test_the_damage_chart_has_one_point_per_policy_and_budget(one_by_one):
    import pandas as pd

    from kvviz.figures import damage_chart

    chart = damage_chart(pd.DataFrame(one_by_one))
    assert len(chart.data) == 4 and set(chart.data["policy"]) == {"h2o", "streaming_llm"}
    first = chart.data.iloc[0]
    kls = sorted(r["kl_mean"] for r in one_by_one if r["policy"] == first["policy"] and r["budget"] == first["budget"])
    assert first["median"] == pytest.approx(sum(kls) / 2) and first["low"] <= first["median"] <= first["high"]


def test_a_case_opened_again_keeps_its_cache_scheme(one_by_one):
    """A row of a sweep over cache schemes opens as a run with that scheme (the app's *Open as a policy run* once
    dropped it and ran the model's own cache)."""
    from kvviz.policies.user import available
    from kvviz.schemes.kivi import Kivi
    from kvviz.schemes.quanto import QuantoCache
    from kvviz.sweeps.cases import case_of, run_settings

    row = {**one_by_one[0], "scheme": "kivi-2"}
    settings = run_settings(case_of(row), available())
    assert settings.cache_format == Kivi(2, 2) and settings.policy.name == row["policy"]
    quanto = run_settings(case_of({**row, "scheme": "quanto-4"}), available())
    assert quanto.cache_format == QuantoCache(4)
    assert run_settings(case_of({**row, "scheme": "fp16"}), available()).cache_format is None
