"""The benchmark's measuring and reporting (the rows themselves run with ``python -m benchmarks``, not in tests:
timings do not belong in unit tests)."""

from __future__ import annotations

import pytest

from benchmarks.bench import chosen, planned
from benchmarks.harness import paired_times, row, table
from kvviz.cli import main
from kvviz.errors import KvvizError


def test_paired_times_alternate_ours_and_plain_with_untimed_setups(monkeypatch):
    import benchmarks.harness

    clock = [0.0]  # a fake clock: each action advances it by a known amount, so no real timing is asserted
    monkeypatch.setattr(benchmarks.harness.time, "perf_counter", lambda: clock[0])
    calls = []

    def ours(state):
        calls.append(("ours", state))
        clock[0] += 2.0

    def plain(state):
        calls.append(("plain", state))
        clock[0] += 1.0

    def setup():
        clock[0] += 100.0  # untimed: must not show in the plain median
        return "cache"

    mine, theirs = paired_times(ours, plain, 3, theirs_setup=setup)
    assert calls == [("ours", None), ("plain", "cache")] * 4  # one warm-up each, then 3 alternating pairs
    assert (mine, theirs) == ([2.0] * 3, [1.0] * 3)


def test_rows_pass_or_fail_by_their_direction_and_print_as_a_table():
    slower = row("whatif", 0.2, 0.1, 1.3)
    faster = row("generate", 12.0, 10.0, 0.85, higher_is_better=True, unit="tok/s")
    assert (slower.ratio, slower.ok) == (2.0, False) and (faster.ratio, faster.ok) == (1.2, True)
    report = {"rows": [vars(slower), vars(faster)], "machine": {"platform": "p", "cpus": 2, "threads": 2, "device": "cpu",
                                                                 "torch": "t", "model": "m", "dtype": "float32"}}
    text = table(report)
    assert "| whatif | 2.00 | ≤ 1.3 | NO |" in text and "| generate | 1.20 | ≥ 0.85 | yes |" in text


def test_a_row_of_repeats_is_the_ratio_of_medians_with_both_ranges_in_its_detail():
    measured = row("whatif", [0.30, 0.10, 0.12, 0.11, 0.50], [0.10, 0.05, 0.04, 0.06, 0.20], 1.3)
    assert measured.ratio == 0.12 / 0.06 and not measured.ok  # medians 0.12 and 0.06, not means
    assert measured.detail == "kvviz 0.12 s (0.1–0.5) vs plain 0.06 s (0.04–0.2)"


def test_rows_are_chosen_by_name_and_a_pattern_that_names_no_row_is_refused():
    names = list(planned())
    assert names[0] == "load" and "whatif quant 1024" in names and any("browser" in name for name in names)
    assert chosen(names, []) == names
    assert chosen(names, ["quant 1024"]) == ["whatif quant 1024"]
    assert chosen(names, ["memory", "prefill"]) == ["prefill 256", "prefill 1024", "prefill 4096", "prefill 8000",
                                                   "click during prefill 8000", "memory 4096",
                                                   "policy run prefill 64, kv_zip, 1k",
                                                   "policy run prefill 64, CapPress (kvpress' code), 1k"]
    quick = list(planned(quick=True))
    assert "whatif evict 4096" not in quick and "memory 1024" in quick and not any("browser" in n for n in quick)
    assert not any("browser" in name for name in planned(browser=False))
    with pytest.raises(KvvizError, match="no benchmark row matches 'qaunt'; the rows are: load, prefill 256"):
        chosen(names, ["quant", "qaunt"])


def test_the_bench_command_refuses_bad_options_before_loading_a_model(capsys, monkeypatch):
    import benchmarks.bench

    monkeypatch.setattr(benchmarks.bench, "Bench", None)  # constructing it (loading the models) would fail loudly
    assert main(["bench", "--only", "nothing like it"]) == 2
    assert "no benchmark row matches 'nothing like it'" in capsys.readouterr().err
    assert main(["bench", "--repeats", "0"]) == 2
    assert "repeats must be at least 1, got 0" in capsys.readouterr().err
