"""The commit-log contract, checked by a type checker: mypy reads tests/support/contracts.py (``CommitLog`` and a
policy run's ``Timeline`` returned as :class:`kvviz.edit.commits.Commits`, a session given a timeline) and must find
nothing; a log that lost a parameter of one method is refused by the same run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PLANTED = '''
import torch

from kvviz.edit.commits import CommitLog, Commits


class LostParameter(CommitLog):
    def hidden(self, slot: int) -> torch.Tensor:  # type: ignore[override]
        return super().hidden(slot, slot)


def planted(log: LostParameter) -> Commits:
    return log
'''


def test_the_commit_logs_satisfy_the_commits_protocol(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED)
    run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "tests/support/mypy.ini", "--cache-dir",
                          str(tmp_path / "cache"), "tests/support/contracts.py", str(planted)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith(str(planted)), run.stdout + run.stderr
    assert '"LostParameter"' in errors[0] and '"Commits"' in errors[0]
