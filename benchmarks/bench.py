"""``python -m benchmarks`` (or ``python -m kvviz bench``): kvviz against plain transformers, measured side by side
in one run, printed as a table of ratios with their targets. See :mod:`benchmarks.harness` for how rows are timed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict

from benchmarks.harness import Row, machine, table
from benchmarks import kvpress_rows, policy_rows
from benchmarks.architecture_rows import architecture_rows
from benchmarks.launch_rows import launch_rows
from benchmarks.model_rows import Bench
from benchmarks.startup_rows import cold_start_row
from benchmarks.sweep_rows import sweep_row
from kvviz.errors import KvvizError


def planned(quick: bool = False, browser: bool = True) -> dict[str, Callable[[Bench], Row | list[Row]]]:
    """The rows a run measures, by name, in order; ``quick`` drops the 4k contexts and the browser rows. The browser's
    three rows are measured together (one app, one page), under one name."""
    contexts = (256, 1024) if quick else (256, 1024, 4096)
    memory = 1024 if quick else 4096
    rows: dict[str, Callable[[Bench], Row | list[Row]]] = {"load": lambda b: b.load()}
    rows |= {f"prefill {n}": lambda b, n=n: b.prefill(n) for n in (*contexts, *(() if quick else (8000,)))}
    rows |= {"generate 64": lambda b: b.generate(), "whatif evict 1024": lambda b: b.whatif(1024),
             "whatif evict 1024 cold": lambda b: b.whatif(1024, cold=True)}
    rows |= {} if quick else {"whatif evict 4096": lambda b: b.whatif(4096),
                              "whatif evict 4096 cold": lambda b: b.whatif(4096, cold=True),
                              "whatif quant 4096": lambda b: b.whatif(4096, quantize=True),
                              "whatif evict 8000": lambda b: b.whatif(8000),
                              "click during prefill 8000": lambda b: b.click_during_prefill()}
    rows |= {"whatif quant 1024": lambda b: b.whatif(1024, quantize=True),
             "whatif fp8 1024": lambda b: b.whatif(1024, quantize=True, fp8=True),
             "whatif quanto-4 1024": lambda b: b.whatif(1024, quantize=True, scheme="quanto-4"),
             "whatif int4-token+hadamard 1024": lambda b: b.whatif(1024, quantize=True, scheme="int4-token+hadamard"),
             "whatif nvfp4 1024": lambda b: b.whatif(1024, quantize=True, scheme="nvfp4"),
             "whatif mxfp4 1024": lambda b: b.whatif(1024, quantize=True, scheme="mxfp4"),
             "whatif k8v4-token-head 1024": lambda b: b.whatif(1024, quantize=True, scheme="k8v4-token-head"),
             f"memory {memory}": lambda b: b.memory(memory)}
    rows |= {"policy run decode 64, h2o, 1k": policy_rows.policy_run, "blame 32 slots at 1k": policy_rows.blame_row,
             "run nvfp4 decode 64, 1k": lambda b: policy_rows.scheme_run(b, "nvfp4"),
             "run int4-token-head decode 64, 1k": lambda b: policy_rows.scheme_run(b, "int4-token-head"),
             "run quantized-fp8 decode 64, 1k": lambda b: policy_rows.scheme_run(b, "quantized-fp8")}
    rows |= {} if quick else {"policy run decode 64, key_diff, 1k": policy_rows.key_diff_run,
                              "policy run decode 64, lag_kv, 1k": policy_rows.lag_kv_run,
                              "policy run decode 64, chunk_kv, 1k": policy_rows.chunk_kv_run,
                              "policy run decode 64, expected_attention, 1k": policy_rows.expected_attention_run,
                              "policy run decode 64, cur, 1k": policy_rows.cur_run,
                              "policy run decode 64, critical_kv, 1k": policy_rows.critical_kv_run,
                              "policy run prefill 64, kv_zip, 1k": policy_rows.kv_zip_run}
    rows |= {} if quick else {"policy run prefill 64, CapPress (kvpress' code), 1k": kvpress_rows.cap_press_run,
                              "policy run decode 64, DecodingPress over TOVA (kvpress' code), 1k":
                                  kvpress_rows.decoding_press_run,
                              "sweep beside kvpress' pipeline": kvpress_rows.pipeline_row}
    rows |= {"launches of two what-ifs at 1024": launch_rows}
    rows |= {"sweep throughput, batch 4": sweep_row}
    rows |= {"whatif evict 512 on tiny llama … gemma3, smollm3, gpt_oss": architecture_rows}
    if browser and not quick:
        rows["browser click and settled 2048, 8000, overview draw"] = _browser
        rows["timeline draw 1k × 256"] = policy_rows.timeline_draw
        rows["app cold start"] = cold_start_row
    return rows


def chosen(names: Iterable[str], only: Sequence[str]) -> list[str]:
    """The names containing one of ``only`` (all of them when it is empty); refuses a pattern that matches none."""
    names = list(names)
    for part in only:
        if not any(part in name for name in names):
            raise KvvizError(f"no benchmark row matches {part!r}; the rows are: {', '.join(names)}")
    return [name for name in names if not only or any(part in name for part in only)]


def _browser(bench: Bench) -> list[Row]:
    from benchmarks.browser_rows import browser_rows

    try:
        return browser_rows(bench.lm, repeats=bench.repeats)
    except Exception as exc:  # noqa: BLE001 — a browser problem must not lose the other rows
        return [Row("browser rows", float("nan"), 0.3, False, False, f"failed: {type(exc).__name__}: {exc}")]


def run(quick: bool = False, browser: bool = True, only: Sequence[str] = (), repeats: int = 5) -> dict:
    """The rows of :func:`planned` (those :func:`chosen` by ``only``), medians of at least ``repeats``."""
    if repeats < 1:
        raise KvvizError(f"repeats must be at least 1, got {repeats}")
    rows = planned(quick, browser)
    names = chosen(rows, only)  # before loading anything: a typo is refused at once
    bench = Bench(repeats)
    results: list[Row] = []
    for name in names:
        if name != "load":  # `load` measures loading before any other work; everything else runs warm
            bench.warm()
        measured = rows[name](bench)
        results += measured if isinstance(measured, list) else [measured]
    return {"rows": [asdict(r) for r in results], "machine": machine() | {"model": bench.lm.name,
                                                                            "dtype": str(bench.lm.dtype)}}


def report(args: argparse.Namespace) -> str:
    """Run the rows the flags choose; the table (or JSON) to print."""
    result = run(quick=args.quick, browser=not args.no_browser, only=args.only, repeats=args.repeats)
    return json.dumps(result) if args.json else table(result)
