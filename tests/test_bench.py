"""The benchmark's measuring and reporting (the rows themselves run with ``python -m kvviz bench``, not in tests:
timings do not belong in unit tests)."""

from __future__ import annotations

from kvviz.bench import paired_medians, row, table


def test_paired_medians_alternate_ours_and_plain_with_untimed_setups(monkeypatch):
    import kvviz.bench

    clock = [0.0]  # a fake clock: each action advances it by a known amount, so no real timing is asserted
    monkeypatch.setattr(kvviz.bench.time, "perf_counter", lambda: clock[0])
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

    mine, theirs = paired_medians(ours, plain, 3, theirs_setup=setup)
    assert calls == [("ours", None), ("plain", "cache")] * 4  # one warm-up each, then 3 alternating pairs
    assert (mine, theirs) == (2.0, 1.0)


def test_rows_pass_or_fail_by_their_direction_and_print_as_a_table():
    slower = row("whatif", 0.2, 0.1, 1.3)
    faster = row("generate", 12.0, 10.0, 0.85, higher_is_better=True, unit="tok/s")
    assert (slower.ratio, slower.ok) == (2.0, False) and (faster.ratio, faster.ok) == (1.2, True)
    report = {"rows": [vars(slower), vars(faster)], "machine": {"platform": "p", "cpus": 2, "threads": 2, "device": "cpu",
                                                                 "torch": "t", "model": "m", "dtype": "float32"}}
    text = table(report)
    assert "| whatif | 2.00 | ≤ 1.3 | NO |" in text and "| generate | 1.20 | ≥ 0.85 | yes |" in text
