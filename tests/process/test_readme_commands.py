"""The README's command-line examples run as printed — the flags on the page, in order, each in a shell of its own, on
the bundled model — from a folder laid out as the checkout (its ``.venv``, ``kvviz`` and ``assets`` linked), so what
they write (``SESSION.json``, ``PAGE.html``) stays out of the checkout; and they say what the README says they show.
(Their times, 10–20 s each on 2 cores, are the README's measurement, not checked here: a loaded CI machine is
slower.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """Every ``.venv/bin/python -m kvviz …`` command of the README's plain code blocks, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```\n(.*?)^```", text, flags=re.S | re.M)
    joined = [re.sub(r"\\\n\s*", "", block) for block in blocks]  # bash's line continuation (also inside quotes)
    return [line for block in joined for line in block.splitlines() if line.startswith(".venv/bin/python -m kvviz ")]


COMMANDS = readme_commands()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    for name in (".venv", "kvviz", "assets"):
        (folder / name).symlink_to(ROOT / name)
    return folder


def test_the_readme_shows_each_kind_of_command():
    assert {c.split()[3] for c in COMMANDS} >= {"whatif", "quant-compare", "chat", "export-page", "policy-run",
                                                "sweep"}


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{i}-{c.split()[3]}" for i, c in enumerate(COMMANDS)])
def test_a_readme_command_runs_as_printed(command, checkout):
    out = subprocess.run(["bash", "-c", command], cwd=checkout, capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "TMPDIR": str(checkout), "HOME": str(Path.home())})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() or (checkout / "PAGE.html").exists()
    kind = command.split()[3]
    if kind == "sweep":
        assert re.search(r"^\d+ cases in .*/sweep/table\.csv", out.stdout, flags=re.M), out.stdout
        assert not (checkout / "sweep").exists()  # written under the temporary folder, not where it ran
    if kind == "policy-run":
        full = re.search(r"^  full:   (.*)$", out.stdout, flags=re.M)[1]
        policy = re.search(r"^  policy: (.*)$", out.stdout, flags=re.M)[1]
        assert full.startswith("Zorblax") and re.search(r"^  divergence: step \d+$", out.stdout, flags=re.M)
        if "--policy h2o" in command:  # the README's reading of the first example
            assert not policy.startswith("Zorblax") and "divergence: step 0" in out.stdout
            assert re.search(r"^blame at step 0 ", out.stdout, flags=re.M) and "top-1 back" in out.stdout
