"""The launcher runs the server with two malloc arenas unless told otherwise (the launch script run in bash)."""

from __future__ import annotations

import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def test_the_launcher_runs_the_server_with_two_malloc_arenas_unless_told_otherwise():
    """glibc's 8 arenas per core kept ~90-130 MB of six closed sessions resident after the trim; 2 kept ~20-30 MB
    (benchmarks/sessions_load.py, docs/serving.md)."""
    import subprocess

    launcher = (ROOT / "scripts" / "app.sh").read_text()
    line = next(line for line in launcher.splitlines() if "streamlit run app/main.py" in line)
    command = line.replace(".venv/bin/streamlit run app/main.py \"$@\"", "printenv MALLOC_ARENA_MAX")
    for given, expected in ((None, "2"), ("4", "4")):
        env = {"PATH": "/usr/bin:/bin"} | ({"MALLOC_ARENA_MAX": given} if given else {})
        shown = subprocess.run(["bash", "-euc", command], env=env, capture_output=True, text=True, check=True)
        assert shown.stdout.strip() == expected
