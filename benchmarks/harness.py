"""The benchmark's harness: paired timings of kvviz and a plain-transformers baseline, rows of ratios, the table.

Every row is a ratio of medians (≥ 5 repeats after a warm-up) of kvviz's operation and a plain-transformers baseline
measured right beside it on the same machine, so machine noise cancels as far as it can. Browser rows are absolute
seconds (there is no baseline for a click).
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Row:
    name: str
    ratio: float
    target: float
    higher_is_better: bool
    ok: bool
    detail: str


def paired_times(
    ours: Callable[[Any], object], theirs: Callable[[Any], object], repeats: int,
    ours_setup: Callable[[], Any] = lambda: None, theirs_setup: Callable[[], Any] = lambda: None,
) -> tuple[list[float], list[float]]:
    """Wall times of ``ours`` and ``theirs``, ``repeats`` runs each after one warm-up each, run alternately (ours,
    theirs, ours, …) so a noisy machine's drift touches both alike. Each action gets the result of its setup, which
    runs untimed just before it."""
    times: tuple[list[float], list[float]] = ([], [])
    for index in range(repeats + 1):
        for side, (action, setup) in enumerate(((ours, ours_setup), (theirs, theirs_setup))):
            state = setup()
            gc.collect()
            start = time.perf_counter()
            action(state)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if index:
                times[side].append(time.perf_counter() - start)
    return times


def row(name: str, ours: float | Sequence[float], theirs: float | Sequence[float], target: float,
        higher_is_better: bool = False, unit: str = "s") -> Row:
    """The ratio of ``ours`` to ``theirs``: one value each, or each side's repeats — then their medians, with their
    ranges in the detail (how noisy the machine was)."""
    def side(values: float | Sequence[float]) -> tuple[float, str]:
        if isinstance(values, (int, float)):
            return float(values), ""
        return statistics.median(values), f" ({min(values):.3g}–{max(values):.3g})"

    (mine, mine_range), (plain, plain_range) = side(ours), side(theirs)
    ratio = mine / plain
    ok = ratio >= target if higher_is_better else ratio <= target
    return Row(name, ratio, target, higher_is_better, ok,
               f"kvviz {mine:.4g} {unit}{mine_range} vs plain {plain:.4g} {unit}{plain_range}")


def token_ids(lm, count: int) -> list[int]:
    """A deterministic prompt of ``count`` ordinary tokens (text repeated and tokenized, then cut)."""
    text = "The key-value cache stores the keys and values of every processed token. " * (count // 10 + 1)
    return lm.tokenizer.encode(text, add_special_tokens=False)[:count]

def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}

def table(report: dict) -> str:
    """The report as a Markdown table (the README shows it)."""
    lines = ["| row | ratio | target | ok | detail |", "|---|---|---|---|---|"]
    for r in report["rows"]:
        sign = "≥" if r["higher_is_better"] else "≤"
        lines.append(f"| {r['name']} | {r['ratio']:.2f} | {sign} {r['target']} | {'yes' if r['ok'] else 'NO'} | "
                     f"{r['detail']} |")
    m = report["machine"]
    lines.append(f"\nMachine: {m['platform']}, {m['cpus']} CPUs ({m['threads']} torch threads), {m['device']}, "
                 f"torch {m['torch']}, {m['model']} in {m['dtype']}.")
    return "\n".join(lines)
