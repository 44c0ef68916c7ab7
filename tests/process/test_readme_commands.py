"""The README's command-line examples run as printed — each command's words as bash expands them (quotes, line
continuations, ``"$(mktemp -d)/sweep"``), in order, on the bundled model, in a fresh interpreter started with the
README's own ``.venv/bin/python`` — from a folder laid out as the checkout (its ``.venv``, ``kvviz``, ``assets`` and
``tests`` linked), so what they write (``SESSION.json``, ``PAGE.html``) stays out of the checkout; and they say what the README
says they show. The nine run in one interpreter, one after another, through ``tests.support.cli`` (``kvviz.cli.main``,
as ``python -m kvviz`` runs it)
(a process each would import torch and transformers nine times, ~45 s of a worker); ``tests/process/test_cli.py``
starts the real entry point itself. (Their times, 10–20 s each on 2 cores, are the README's measurement, not checked
here: a loaded CI machine is slower.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIX = ".venv/bin/python -m kvviz "
# What ``python -m kvviz ARGS`` does, for each command's ARGS in turn: tests.support.cli's ``cli`` (its output and
# exit status captured)
RUN_ALL = """
import json, sys
from dataclasses import asdict
from tests.support.cli import cli
print(json.dumps([asdict(cli(*args)) for args in json.loads(sys.stdin.read())]))
"""

def readme_commands() -> list[str]:
    """Every ``.venv/bin/python -m kvviz …`` command of the README's plain code blocks, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```\n(.*?)^```", text, flags=re.S | re.M)
    joined = [re.sub(r"\\\n\s*", "", block) for block in blocks]  # bash's line continuation (also inside quotes)
    return [line for block in joined for line in block.splitlines() if line.startswith(PREFIX)]


COMMANDS = readme_commands()


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The folder the commands ran in, and what each printed (``returncode``, ``stdout``, ``stderr``), in README
    order."""
    folder = tmp_path_factory.mktemp("readme")
    for name in (".venv", "kvviz", "assets", "tests"):
        (folder / name).symlink_to(ROOT / name)
    # a clean environment, but the thread count the tier runs at: beside part 1's other worker, with torch's default
    # threads, the nine took 154 s (53 s alone)
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(folder), "HOME": str(Path.home()),
           **{k: os.environ[k] for k in ("OMP_NUM_THREADS",) if k in os.environ}}
    words = []
    for command in COMMANDS:  # bash's own expansion of the words after the prefix
        printed = subprocess.run(["bash", "-c", "printf '%s\\0' " + command.removeprefix(PREFIX)], cwd=folder,
                                 env=env, capture_output=True, text=True, check=True).stdout
        words.append(printed.split("\0")[:-1])
    out = subprocess.run([".venv/bin/python", "-c", RUN_ALL], input=json.dumps(words), cwd=folder, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    return folder, json.loads(out.stdout)


def test_the_readme_shows_each_kind_of_command():
    assert {c.split()[3] for c in COMMANDS} >= {"whatif", "quant-compare", "chat", "export-page", "policy-run",
                                                "sweep"}


@pytest.mark.parametrize("index", range(len(COMMANDS)), ids=[f"{i}-{c.split()[3]}" for i, c in enumerate(COMMANDS)])
def test_a_readme_command_runs_as_printed(index, ran):
    folder, done = ran
    command, out = COMMANDS[index], done[index]
    assert out["returncode"] == 0, out["stderr"][-2000:]
    kind = command.split()[3]
    assert out["stdout"].strip() or (kind == "export-page" and (folder / "PAGE.html").exists())
    if kind == "sweep":
        assert re.search(r"^\d+ cases in .*/sweep/table\.csv", out["stdout"], flags=re.M), out["stdout"]
        assert not (folder / "sweep").exists()  # written under the temporary folder, not where it ran
    if kind == "policy-run":
        full = re.search(r"^  full:   (.*)$", out["stdout"], flags=re.M)[1]
        policy = re.search(r"^  policy: (.*)$", out["stdout"], flags=re.M)[1]
        assert full.startswith("Zorblax") and re.search(r"^  divergence: step \d+$", out["stdout"], flags=re.M)
        if "--policy h2o" in command:  # the README's reading of the first example
            assert not policy.startswith("Zorblax") and "divergence: step 0" in out["stdout"]
            assert re.search(r"^blame at step 0 ", out["stdout"], flags=re.M) and "top-1 back" in out["stdout"]
