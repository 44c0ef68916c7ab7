"""Sweeps in other processes: a killed ``python -m kvviz sweep`` resumes to the full table without duplicates, and a
local process pool and a local Ray instance give the rows the runs done one by one give."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvviz.sweeps import records, run_sweep
from tests.support.sweeps import same_rows

ROOT = Path(__file__).resolve().parents[2]


def test_a_killed_sweep_resumes_to_the_full_table_without_duplicates(eps, sweep_spec, one_by_one, tmp_path):
    command = [sys.executable, "-m", "kvviz", "sweep", "--prompts", sweep_spec.prompts, "--policy", "h2o", "--policy",
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
    table = run_sweep(sweep_spec, tmp_path, progress=False)
    same_rows(eps, records(table), one_by_one)  # the first rows come from the killed process
    keys = [json.loads(line)["key"] for line in rows.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 8


def test_a_local_process_pool_gives_the_same_rows(eps, sweep_spec, one_by_one, tmp_path):
    same_rows(eps, records(run_sweep(sweep_spec, tmp_path, workers=2, progress=False)), one_by_one)


def test_ray_tasks_on_a_local_instance_give_the_same_rows(eps, sweep_spec, one_by_one, tmp_path):
    ray = pytest.importorskip("ray")
    try:
        same_rows(eps, records(run_sweep(sweep_spec, tmp_path, workers=2, ray="local", progress=False)), one_by_one)
    finally:
        ray.shutdown()
