"""The command line in the test's own process: ``python -m kvviz ARGS`` is ``kvviz.cli.main(ARGS)``, so a test calls
that with stdout and stderr captured instead of paying a new interpreter's torch and transformers imports (7–18 s on
a loaded 2-core machine). ``tests/process/test_cli.py`` runs the real entry point in a process of its own."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

from kvviz.cli import main


@dataclass(frozen=True)
class Done:
    """What a run of the command printed and its exit status, named as ``subprocess.CompletedProcess`` names them."""

    returncode: int
    stdout: str
    stderr: str


def cli(*args: str) -> Done:
    """``python -m kvviz ARGS`` in this process. argparse's own refusals (``SystemExit``) count as their status."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    return Done(status, out.getvalue(), err.getvalue())
