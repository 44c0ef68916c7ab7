"""Sweep throughput: cases per minute of ``run_sweep`` in one process (the model loaded in it, a prompt's 4 cases
decoded as one batch) against a plain loop of transformers ``generate`` over the same prompts (one greedy reply per
case, the chat template applied the same way)."""

from __future__ import annotations

import tempfile
import time

import torch

from benchmarks.harness import Row, row
from kvviz.sweeps import SweepSpec, run_sweep

SPEC = SweepSpec("builtin:vars", ("h2o", "streaming_llm"), (0.25, 0.5), max_new_tokens=24)


def sweep_row(bench) -> Row:
    cases = SPEC.cases()
    tokenizer = bench.lm.tokenizer
    start = time.perf_counter()
    for case in cases:
        messages = [{"role": "user", "content": case.prompt.turns[0]}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            bench.plain.generate(ids, max_new_tokens=SPEC.max_new_tokens, do_sample=False)
    plain = len(cases) / (time.perf_counter() - start) * 60
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        run_sweep(SPEC, folder, workers=1, progress=False, batch=4)
        ours = len(cases) / (time.perf_counter() - start) * 60
    return row(f"sweep {len(cases)} cases, batch 4 (cases/min)", ours, plain, 1.4, higher_is_better=True,
               unit="cases/min")
