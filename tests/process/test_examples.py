"""Every example notebook runs on the bundled model as a person would run it (a kernel started in ``examples/``,
every cell in order, nbclient), with no error cell and no URL in any output; the marimo example runs as a script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_example_notebook_runs(path: Path):
    book = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in book.cells if cell.cell_type == "code"), "commit it without outputs"
    # the kernel is this Python's (the environment's ipykernel), started in examples/ as JupyterLab would start it
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}},
                   env={**os.environ, "OMP_NUM_THREADS": "1"}).execute()  # raises on an error cell
    shown = [out for cell in book.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in shown if out.output_type == "error"]
    assert any("text/html" in out.get("data", {}) for out in shown), "nothing rich was shown"
    text = nbformat.writes(book)
    assert not re.search(r"https?://|//cdn", text), "an output names a URL"


def test_marimo_example_runs_as_a_script():
    done = subprocess.run([sys.executable, str(EXAMPLES / "explore_marimo.py")], capture_output=True, text=True,
                          timeout=600, cwd=EXAMPLES, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "evicted [12] · KL" in done.stdout  # the script's own check ran (its assert compares with what_if)
