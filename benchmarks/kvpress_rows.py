"""kvpress' presses as their users run them, measured:

- ``policy run prefill 64, CapPress (kvpress' code), 1k`` and ``policy run decode 64, DecodingPress over TOVA
  (kvpress' code), 1k``: a press object run through its own code (kvviz.policies.kvpress.own_code; the second on the
  mirror of kvpress' cache, kvpress' hook before every step) on a 1k prompt with 64 new tokens, vs plain ``generate``.
- ``sweep beside kvpress' pipeline``: cases per minute of ``kvviz sweep`` (KnormPress at ratio 0.5, prefill mode: a
  full run, the press's run, teacher-forced KL, the RULER metric) against kvpress' own ``kv-press-text-generation``
  pipeline answering the same cases with the same press, in kvpress' own environment (``KVPRESS_PYTHON``: a Python
  with kvpress 0.5.5 and transformers < 5.3, e.g. ``python3 -m venv V && V/bin/pip install torch==2.13.0
  kvpress==0.5.5``); without it the row says so and measures nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Row, row
from benchmarks.policy_rows import policy_run
from kvviz.policies.base import Ratio
from kvviz.policies.kvpress.own_code import kvpress
from kvviz.policies.kvpress.presses import from_press
from kvviz.sweeps import SweepSpec, run_sweep
from kvviz.sweeps.ruler import ruler_set

TOKENS = 24


def cap_press_run(bench) -> Row:
    press = from_press(kvpress().CapPress(compression_ratio=0.75))
    return policy_run(bench, policy=press.policy, budget=press.ratio, mode="prefill",
                      name="policy run prefill 64, CapPress (kvpress' code), 1k")


def decoding_press_run(bench) -> Row:
    module = kvpress()
    press = from_press(module.DecodingPress(module.TOVAPress(), compression_interval=16, target_size=256))
    return policy_run(bench, policy=press.policy, budget=press.ratio, mode=press.mode,
                      name="policy run decode 64, DecodingPress over TOVA (kvpress' code), 1k")


def pipeline_row(bench) -> Row:
    name = "sweep beside kvpress' pipeline (cases/min)"
    python = os.environ.get("KVPRESS_PYTHON")
    if not python:
        return Row(name, float("nan"), 1.0, True, False, "not measured: set KVPRESS_PYTHON to kvpress' own Python")
    from kvviz.model import resolve_checkpoint

    items = []
    for prompt in [p for set_name in ("niah_multikey", "vt", "cwe") for p in ruler_set(set_name)]:
        context, _, question = prompt.turns[-1].rpartition("\n\n")  # the question is the text's last paragraph
        items.append({"context": context + "\n\n", "question": question, "answer": list(prompt.answers),
                      "task": prompt.family, "max_new_tokens": TOKENS})
    with tempfile.TemporaryDirectory() as folder:
        cases = Path(folder) / "cases.jsonl"  # kvviz reads kvpress' columns; kvpress' loop the same items
        cases.write_text("".join(json.dumps(item) + "\n" for item in items))
        (Path(folder) / "cases.json").write_text(json.dumps(items))
        done = subprocess.run([python, str(Path(__file__).with_name("kvpress_pipeline.py")),
                               str(Path(folder) / "cases.json"), str(resolve_checkpoint(None)[0]), "KnormPress",
                               "0.5", str(TOKENS)], capture_output=True, text=True, cwd=folder,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        if done.returncode:
            return Row(name, float("nan"), 1.0, True, False, f"kvpress' pipeline failed: {done.stderr[-300:]}")
        theirs = json.loads(done.stdout.strip().splitlines()[-1])["cases_per_min"]
        spec = SweepSpec(str(cases), ("kvpress:KnormPress",), (Ratio(0.5),), mode="prefill", max_new_tokens=TOKENS)
        start = time.perf_counter()
        run_sweep(spec, Path(folder) / "sweep", workers=1, progress=False, batch=4)
        ours = len(items) / (time.perf_counter() - start) * 60
    return row(name, ours, theirs, 1.0, higher_is_better=True, unit="cases/min")
