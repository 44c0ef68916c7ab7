"""Bad flags are refused at the edge: one line, exit status 2, before torch is imported — every case run through
``kvviz.cli.main`` in one fresh process whose torch import is refused and counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvviz.errors import KvvizError

ROOT = Path(__file__).resolve().parents[2]
TURN = ["--turn", "hi", "--max-new-tokens", "2"]
# One process for every case: torch's import is refused there (and counted), so each case shows whether it reached
# for torch, which a later case's ``'torch' in sys.modules`` could not tell once an earlier case had loaded it.
PROBE = """
import io, json, sys
from contextlib import redirect_stderr


class NoTorch:
    reached = 0

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            NoTorch.reached += 1
            raise ImportError("torch is refused in this probe")


sys.meta_path.insert(0, NoTorch())
import kvviz.numbers, kvviz.quant.names
edge = {"torch": NoTorch.reached > 0 or "torch" in sys.modules}
from kvviz.cli import main
cases = []
for args in json.loads(sys.argv[1]):
    NoTorch.reached, err = 0, io.StringIO()
    with redirect_stderr(err):
        try:
            status = main(args)
        except SystemExit as exit:  # argparse's own refusals
            status = exit.code
    cases.append({"status": status, "torch": NoTorch.reached > 0, "stderr": err.getvalue().strip().splitlines()})
print(json.dumps({"edge": edge, "cases": cases}))
"""
CASES = [
    (["policy-run", *TURN, "--policy", "kvpress:SnapKVPress", "--param", "compression_ratio=abc"],
     "compression_ratio must be a number, got 'abc'"),
    (["policy-run", *TURN, "--policy", "kvpress:SnapKVPress", "--param", "compression_ratio=nan"], "got NaN"),
    (["policy-run", *TURN, "--policy", "kvpress:SnapKVPress", "--param", "compression_ratio=1e400"],
     "must be finite"),
    (["policy-run", *TURN, "--policy", "kvpress:DecodingPress", "--param", "base_press=KnormPress",
      "--param", "compression_interval=99999999999999999999999"], "compression_interval must be finite"),
    (["policy-run", *TURN, "--policy", "kvpress:DecodingPress", "--param", "base_press=KnormPress",
      "--param", "target_size=abc"], "target_size must be an integer"),
    (["policy-run", *TURN, "--policy", "h2o", "--ratio", "nan"], "compression ratio must be a number, got NaN"),
    (["policy-run", *TURN, "--policy", "h2o", "--budget", "8", "--scheme", "int4-channel"],
     "not a cache a run writes slot by slot"),
    (["policy-run", *TURN, "--scheme", "mix3-keyerror"], "not a cache a run writes slot by slot"),
    (["policy-run", *TURN, "--scheme", "int2-token+outliers4"], "not a cache a run writes slot by slot"),
    (["policy-run", *TURN, "--scheme", "kivi-2", "--round-own"], "--round-own is for a per-slot --scheme"),
    (["policy-run", *TURN, "--scheme", "quantized-fp8", "--round-own"], "--round-own is for a per-slot --scheme"),
    (["policy-run", *TURN, "--scheme", "quanto-4", "--blame-step", "1"], "--blame-step needs a policy"),
    (["whatif", *TURN, "--scheme", "mix8.999-keyerror"], "average width must be from 2 to 8"),
    (["quant-compare", *TURN, "--scheme", "mix8.999-keyerror"], "average width must be from 2 to 8"),
    (["quant-compare", *TURN, "--scheme", "int4-token", "--calibration", ""], "--calibration: is empty"),
    (["whatif", *TURN, "--scheme", "fp8-e4m3-head-static", "--calibration", "  "], "--calibration: is empty"),
    # issue #61: refused before torch (a budget of NaN took 8.9 s, --param foo, a missing press file and an unknown
    # built-in set 9–15 s), ranges checked before they are expanded (0-400000000 built an ~11 GB list)
    (["policy-run", *TURN, "--policy", "h2o", "--budget", "nan"], "a fractional budget must be a number, got NaN"),
    (["policy-run", *TURN, "--policy", "h2o", "--budget", "0"], "a budget of slots must be at least 1"),
    (["sweep", "--prompts", "builtin:needle", "--policy", "h2o", "--budget", "nan"], "must be a number, got NaN"),
    (["policy-run", *TURN, "--policy", "h2o", "--budget", "8", "--param", "foo"], "bad --param 'foo'"),
    (["policy-run", *TURN, "--press-file", "/nonexistent/press.py:MyPress", "--ratio", "0.5"],
     "--press-file: no file /nonexistent/press.py"),
    (["sweep", "--prompts", "builtin:nonesuch", "--policy", "h2o", "--budget", "8"], "no built-in prompt set"),
    (["sweep", "--prompts", "/nonexistent/prompts.jsonl", "--policy", "h2o", "--budget", "8"],
     "prompt file /nonexistent/prompts.jsonl does not exist"),
    (["whatif", *TURN, "--evict", "0-400000000"], "slot 400,000,000 does not exist"),
    (["whatif", *TURN, "--bits-for", "0-400000000=4"], "slot 400,000,000 does not exist"),
    (["whatif", *TURN, "--evict", "1", "--evict-layers", "0-400000000"], "slot 400,000,000 does not exist"),
    (["whatif", *TURN, "--evict", "1", "--evict-heads", "2-1"], "bad slot list '2-1'"),
    (["whatif", *TURN, "--topk", "0"], "top-k must be in [1, 1024], got 0"),
    (["whatif", *TURN, "--topk", "100000"], "top-k must be in [1, 1024], got 100000"),
    (["chat", "--turn", "hi", "--max-new-tokens", "-1"], "max_new_tokens must be at least 1, got -1"),
    (["chat", "--turn", "hi", "--max-new-tokens", "9" * 5000], "max_new_tokens must be an integer"),
]


@pytest.fixture(scope="module")
def probed() -> dict:
    """Every case of CASES through ``kvviz.cli.main`` in one fresh process whose torch import is refused."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps([args for args, _ in CASES])], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)), ids=[message for _, message in CASES])
def test_flag_refusals_are_one_line_exit_2_without_torch(probed, case):
    result, message = probed["cases"][case], CASES[case][1]
    stderr = result["stderr"]
    assert result["status"] == 2, stderr
    assert result["torch"] is False
    assert "Traceback" not in "\n".join(stderr)
    assert message in stderr[-1], stderr
    assert sum(line.startswith(("error:", "python -m kvviz")) for line in stderr) == 1  # one error line


def test_scheme_names_are_checked_without_torch_and_mix_widths_match_the_allocation(probed):
    from kvviz.quant.allocation import WIDTHS
    from kvviz.quant.names import MIX_WIDTHS, check_names, scheme_family

    assert MIX_WIDTHS == (WIDTHS[0], WIDTHS[-1])
    assert scheme_family("mix8-uniform") == "mix" and scheme_family("mix2.5-keyerror") == "mix"
    for bad in ("mix8.999-keyerror", "mix8.01-uniform"):
        with pytest.raises(KvvizError, match="average width"):
            scheme_family(bad)
    with pytest.raises(KvvizError, match="named twice"):
        check_names(["int4-token", "int4-token"])
    assert probed["edge"] == {"torch": False}  # kvviz.quant.names and kvviz.numbers import without torch
