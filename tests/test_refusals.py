"""Bad numbers and names are refused at the edge: one line, exit status 2, before torch loads where the flag alone
tells (kvviz.numbers, kvviz.quant.names), and every policy parameter finite in float32 and inside its range."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvviz.errors import KvvizError
from kvviz.numbers import FLOAT32_MAX, number, press_budgets

ROOT = Path(__file__).resolve().parents[1]
TURN = ["--turn", "hi", "--max-new-tokens", "2"]
PROBE = ("import json, sys\nfrom kvviz.cli import main\nstatus = main(sys.argv[1:])\n"
         "print(json.dumps({'status': status, 'torch': 'torch' in sys.modules}))")


def cli(*args: str) -> tuple[dict, list[str]]:
    """``python -m kvviz ARGS`` in a fresh process: its status, whether torch was imported, and its stderr lines."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"status": done.returncode}, done.stderr.strip().splitlines()


@pytest.mark.parametrize("args, message", [
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
])
def test_flag_refusals_are_one_line_exit_2_without_torch(args, message):
    result, stderr = cli(*args)
    assert result["status"] == 2, stderr
    assert result.get("torch") is False or result.get("torch") is None  # argparse exits before the probe prints
    assert "Traceback" not in "\n".join(stderr)
    assert message in stderr[-1], stderr
    assert sum(line.startswith(("error:", "python -m kvviz")) for line in stderr) == 1  # one error line


@pytest.mark.parametrize("name, params, message", [
    ("pyramid_kv", {"beta": "nan"}, "pyramid_kv's beta must be a number, got NaN"),
    ("pyramid_kv", {"beta": "1e39"}, "must be finite"),  # finite in Python, infinite as float32
    ("pyramid_kv", {"beta": float("nan")}, "got NaN"),  # a number from the app's widgets, not text
    ("pyramid_kv", {"beta": -1.0}, "beta must be above 0"),
    ("expected_attention", {"epsilon": "-1"}, "epsilon must be at least 0"),
    ("snapkv", {"window": "1e12"}, "must be an integer"),
    ("streaming_llm", {"sinks": "99999999999"}, "must be finite and at most"),
    ("h2o", {"recent_fraction": "inf"}, "must be finite"),
])
def test_policy_parameters_are_finite_in_float32_and_in_range(name, params, message):
    from kvviz.policies import POLICIES
    from kvviz.policies.by_name import policy_named

    with pytest.raises(KvvizError, match=message.replace("(", r"\(")):
        policy_named(POLICIES, name, params)


def test_good_parameters_still_pass():
    from kvviz.policies import POLICIES
    from kvviz.policies.by_name import policy_named

    assert policy_named(POLICIES, "pyramid_kv", {"beta": "20"}).beta == 20.0
    assert policy_named(POLICIES, "expected_attention", {"epsilon": "0.01"}).epsilon == 0.01
    assert policy_named(POLICIES, "streaming_llm", {"sinks": "4"}).sinks == 4


def test_number_checks_each_way_a_number_can_be_bad():
    assert number("0.5", "x", 0, 1, below=True) == 0.5
    assert number(3, "x", integer=True) == 3 and number(3.0, "x", integer=True) == 3
    assert number(FLOAT32_MAX, "x") == FLOAT32_MAX
    for bad, words in [(True, "must be a number"), ("abc", "must be a number"), (float("nan"), "NaN"),
                       (float("inf"), "finite"), (1e39, "finite"), (-1e39, "finite"), (1.0, "in [0, 1)"),
                       (-0.1, "in [0, 1)")]:
        with pytest.raises(KvvizError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            number(bad, "x", 0, 1, below=True)
    with pytest.raises(KvvizError, match="must be an integer"):
        number(2.5, "x", integer=True)
    with pytest.raises(KvvizError, match="at most 2.147e"):
        number(2**31, "x", integer=True)
    assert press_budgets({"compression_ratio": "0.25", "target_size": "64", "window_size": "x"}) == {
        "compression_ratio": 0.25, "target_size": 64}


def test_scheme_names_are_checked_without_torch_and_mix_widths_match_the_allocation():
    from kvviz.quant.allocation import WIDTHS
    from kvviz.quant.names import MIX_WIDTHS, check_names, scheme_family

    assert MIX_WIDTHS == (WIDTHS[0], WIDTHS[-1])
    assert scheme_family("mix8-uniform") == "mix" and scheme_family("mix2.5-keyerror") == "mix"
    for bad in ("mix8.999-keyerror", "mix8.01-uniform"):
        with pytest.raises(KvvizError, match="average width"):
            scheme_family(bad)
    with pytest.raises(KvvizError, match="named twice"):
        check_names(["int4-token", "int4-token"])
    probe = "import sys, kvviz.quant.names, kvviz.numbers; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True).stdout.strip() \
        == "False"
