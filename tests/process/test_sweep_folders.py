"""A folder another sweep is writing (its lock held by another process) is refused before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvviz.errors import KvvizError
from kvviz.sweeps import read_table, run_sweep
from tests.support.sweeps import folder_with, lines_of, no_model, table_keys

ROOT = Path(__file__).resolve().parents[2]


def test_a_folder_another_sweep_is_writing_is_refused_before_anything_runs(folder_spec, tmp_path):
    folder = folder_with(tmp_path, lines_of(folder_spec))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from kvviz.sweeps.folder import locked\n"
                               "with locked(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()",
         str(folder)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        with pytest.raises(KvvizError, match=rf"is being written by another sweep \(pid {holder.pid}\); wait for it"):
            run_sweep(folder_spec, folder, progress=False, on_row=no_model)
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # no manifest, no table, no row
        assert len(read_table(folder)) == 4  # readers take no lock
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    table = run_sweep(folder_spec, folder, progress=False, on_row=no_model)  # the lock is free again
    assert list(table["key"]) == table_keys(folder) and len(table) == 4
    assert not (folder / "sweep.lock").exists()  # each lock goes with the sweep that held it
