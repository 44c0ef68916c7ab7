"""``python -m kvviz bench``: kvviz against plain transformers, measured side by side in one run.

Every row is a ratio of medians (≥ 5 repeats after a warm-up) of kvviz's operation and a plain-transformers baseline
measured right beside it on the same machine, so machine noise cancels as far as it can. Browser rows are absolute
seconds (there is no baseline for a click). Targets come from the Performance issue.
"""

from __future__ import annotations

import gc
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from kvviz import cache as kv_cache
from kvviz.edits import Edit
from kvviz.errors import KvvizError
from kvviz.model import load_model, resolve_checkpoint
from kvviz.session import Session
from kvviz.whatif import what_if


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


class Bench:
    def __init__(self, repeats: int):
        self.repeats = repeats
        self.lm = load_model()
        folder, _ = resolve_checkpoint(None)
        self.folder = folder
        self.plain = AutoModelForCausalLM.from_pretrained(folder, dtype=self.lm.dtype, attn_implementation="sdpa")
        self.plain.to(self.lm.device).eval().requires_grad_(False)
        self.warmed = False

    def warm(self, count: int = 4096) -> None:
        """One untimed plain prefill of ``count`` tokens, so that every row runs with the allocator in the state a
        long-running app is in: glibc hands out large tensors as fresh pages (page faults on first touch) until a large
        free raises its threshold. Without it the plain 1k decode step measured ~93 ms instead of ~79 ms, flattering
        the what-if ratios by up to 0.3. Once per bench."""
        if self.warmed:
            return
        self.warmed = True
        with torch.no_grad():
            self.plain(input_ids=torch.tensor([token_ids(self.lm, count)], device=self.lm.device),
                       cache=DynamicCache(config=self.plain.config), use_cache=True, logits_to_keep=1)

    def load(self) -> Row:
        def plain(_) -> None:
            AutoTokenizer.from_pretrained(self.folder)
            AutoModelForCausalLM.from_pretrained(self.folder, dtype=self.lm.dtype, attn_implementation="sdpa").to(
                self.lm.device)

        # 9 pairs: with 5 this row measured 0.91–1.22x across runs of unchanged loading code (one load is ~0.35 s,
        # and one slow load moves a median of 5); paired runs of 7 put it at ~1.07x (the custom attention's name
        # alone cost plain transformers ~1.07x)
        return row("load", *paired_times(lambda _: load_model(), plain, max(self.repeats, 9)), 1.2)

    def prefill(self, count: int) -> Row:
        ids = token_ids(self.lm, count)
        tensor = torch.tensor([ids], device=self.lm.device)

        def plain(_) -> None:
            with torch.no_grad():
                self.plain(input_ids=tensor, cache=DynamicCache(config=self.plain.config), use_cache=True, logits_to_keep=1)

        return row(f"prefill {count}", *paired_times(lambda _: Session(self.lm).add_ids(ids), plain, self.repeats), 1.3)

    def generate(self, count: int = 64) -> Row:
        ids = token_ids(self.lm, 32)
        tensor = torch.tensor([ids], device=self.lm.device)

        def ours(_) -> None:
            session = Session(self.lm)
            session.add_ids(ids)  # the prefill chooses the first token; each step decodes one more
            for _ in range(count - 1):
                session.step()

        def plain(_) -> None:
            self.plain.generate(tensor, max_new_tokens=count, min_new_tokens=count, do_sample=False, pad_token_id=2)

        rates = ([count / t for t in times] for times in paired_times(ours, plain, self.repeats))
        return row(f"generate {count}", *rates, 0.85, higher_is_better=True, unit="tok/s")

    def _context(self, count: int) -> Session:
        session = Session(self.lm)
        session.add_ids(token_ids(self.lm, count))
        return session

    def _plain_step(self, session: Session) -> tuple[Callable[[Any], object], Callable[[], Any]]:
        """One plain decode step of the newest slot on its cache (the action and its untimed cache setup)."""
        at = len(session) - 1
        prefix = [tuple(t[:, :, :at] for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(self.lm.layers)]
        slot = session.transcript.slots[at]

        def step(cache) -> None:
            with torch.no_grad():
                self.plain(input_ids=torch.tensor([[slot.id]], device=self.lm.device), cache=cache, use_cache=True,
                           position_ids=torch.tensor([[slot.position]], device=self.lm.device), logits_to_keep=1)

        return step, lambda: kv_cache.build(self.plain.config, prefix)

    def whatif(self, count: int, quantize: bool = False, cold: bool = False) -> Row:
        """A what-if at the newest slot. Warm (the interactive path): the full run of that step is already kept by
        the session, as after the first click. Cold: the session's memo is cleared before each run, so it runs the
        full and the edited pass (two decode steps by design; its target is twice the warm one's)."""
        session = self._context(count)
        at = len(session) - 1
        edit = Edit.quantize(range(at), 4) if quantize else Edit.evict(range(at // 2, at // 2 + 10))
        # quantizing: the history at 4 bits, every other run all but slot 0, so that each run quantizes (a run on the
        # quantization the previous one left in the session's kept cache would reuse it)
        edits = itertools.cycle([edit, Edit.quantize(range(1, at), 4)] if quantize else [edit])
        step, cache = self._plain_step(session)
        ours, plain = paired_times(lambda _: what_if(session, next(edits)), step, max(self.repeats, 11),  # short
                                    ours_setup=session.memo.clear if cold else lambda: None, theirs_setup=cache)
        name = f"whatif {'quant' if quantize else 'evict'} {count}{' cold' if cold else ''}"
        return row(name, ours, plain, (1.5 if quantize else 1.3) * (2 if cold else 1))

    def memory(self, count: int) -> Row:
        usage = self._context(count).memory()
        ratio = usage["recorded_bytes"] / usage["kv_bytes"]
        return Row(f"memory {count}", ratio, 2.0, False, ratio <= 2.0,
                   f"recorded {usage['recorded_bytes']:,} B vs KV cache {usage['kv_bytes']:,} B")


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}


def planned(quick: bool = False, browser: bool = True) -> dict[str, Callable[[Bench], Row | list[Row]]]:
    """The rows a run measures, by name, in order; ``quick`` drops the 4k contexts and the browser rows. The browser's
    three rows are measured together (one app, one page), under one name."""
    contexts = (256, 1024) if quick else (256, 1024, 4096)
    memory = 1024 if quick else 4096
    rows: dict[str, Callable[[Bench], Row | list[Row]]] = {"load": lambda b: b.load()}
    rows |= {f"prefill {n}": lambda b, n=n: b.prefill(n) for n in contexts}
    rows |= {"generate 64": lambda b: b.generate(), "whatif evict 1024": lambda b: b.whatif(1024),
             "whatif evict 1024 cold": lambda b: b.whatif(1024, cold=True)}
    rows |= {} if quick else {"whatif evict 4096": lambda b: b.whatif(4096)}
    rows |= {"whatif quant 1024": lambda b: b.whatif(1024, quantize=True), f"memory {memory}": lambda b: b.memory(memory)}
    if browser and not quick:
        rows["browser click 1024, 2048 and overview draw"] = _browser
    return rows


def chosen(names: Iterable[str], only: Sequence[str]) -> list[str]:
    """The names containing one of ``only`` (all of them when it is empty); refuses a pattern that matches none."""
    names = list(names)
    for part in only:
        if not any(part in name for name in names):
            raise KvvizError(f"no benchmark row matches {part!r}; the rows are: {', '.join(names)}")
    return [name for name in names if not only or any(part in name for part in only)]


def _browser(bench: Bench) -> list[Row]:
    from kvviz.bench_browser import browser_rows

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
