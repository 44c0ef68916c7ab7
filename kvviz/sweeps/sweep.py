"""Run a sweep's cases — in this process, a local process pool or Ray tasks — into one table, resumably.

Rows are appended to ``DIR/rows.jsonl`` by one sweep at a time (it holds ``DIR/sweep.lock`` from reading the rows to
writing the table; a second sweep into the folder is refused), one line per finished case, flushed to disk at once: a
killed sweep loses at most the cases in flight, and a rerun skips every case it has (a torn last line is cut off; any
other line that is not a row is reported and kept). A rerun with more prompts, policies, budgets or schemes grows the
table by the cases it lacks; ``DIR/manifest.json`` holds the settings that change every case's result (model, mode,
reply length, …), written with the first row, and a rerun with others is refused while the folder holds rows. Every
input (prompts, policies, schemes, budgets, the model's path) is checked before the folder is touched: a refused
sweep writes nothing. ``DIR/table.csv`` and ``DIR/table.parquet`` hold the whole table, replaced together.
:mod:`kvviz.sweeps.folder` reads and writes these files (never through a symbolic link; tables replaced whole)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from kvviz.errors import KvvizError
from kvviz.sweeps.cases import Case, Row, by_prompt, cases_for, parts, run_cases
from kvviz.sweeps.folder import CSV, MANIFEST, PARQUET, ROWS, append, appending, locked, make_folder, read_bytes, \
    read_rows, refuse_busy, replace, replace_all, tidy_new_folder
from kvviz.sweeps.sources import load_prompts
from kvviz.sweeps.table import frame, read_table, records  # noqa: F401 (read_table, records: kvviz.sweeps' names)

FORMAT = "kvviz-sweep/2"  # 2: rows count the prefill's last row (step -1) among the steps


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep runs: prompts (a JSONL path or ``builtin:NAME``), policies × budgets, the run's mode, and the
    model (None: bundled)."""

    prompts: str
    policies: tuple[str, ...]
    budgets: tuple[int | float, ...]
    mode: str = "decode"
    every: int = 1
    max_new_tokens: int = 32
    limit: int | None = None
    model: str | None = None
    extra: dict = field(default_factory=dict)
    schemes: tuple[str, ...] = ()  # cache schemes (kivi-N, quanto-N) as an axis; none: the model's own cache

    def cases(self) -> list[Case]:
        """Every case once, in order: a policy, budget or scheme given twice (``--budget 8 --budget 8``, ``--ratio
        0.5 --ratio 0.50``) is one case. Cases are the same when their keys are (a fraction 0.5 and a ratio 0.5,
        or the budgets 1 and 1.0, are not)."""
        unique: dict[str, Case] = {}
        for case in cases_for(load_prompts(self.prompts, self.limit), list(self.policies), list(self.budgets),
                              self.mode, self.every, self.max_new_tokens,
                              [s if s != "fp16" else None for s in self.schemes]):
            unique.setdefault(case.key, case)
        return list(unique.values())


def run_sweep(spec: SweepSpec, out: str | os.PathLike, workers: int = 1, ray: str | None = None,
              progress: bool = True, on_row: Callable[[Row], None] | None = None, batch: int = 4,
              warn: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Run every case of ``spec`` not yet in ``out`` and return the folder's whole table: ``spec``'s cases in order,
    then those an earlier run with other prompts, policies, budgets or schemes added. ``workers`` > 1: a local process
    pool (each worker loads the model once); ``ray``: Ray tasks on the cluster at that address (``auto``, or
    ``local`` for a new local instance), ``workers`` actors. ``batch``: cases of a prompt decoded together
    (:func:`~kvviz.sweeps.cases.run_cases`). ``warn`` (default: a line on stderr) hears of each line of
    ``rows.jsonl`` that is not a row (kept, and skipped) and of a torn last line cut off. A folder another sweep is
    writing, one whose files are symbolic links, or an ``out`` that is not a folder is refused."""
    from kvviz.model import model_source
    from kvviz.policies.base import slots_kept
    from kvviz.policies.user import available
    from kvviz.schemes.written import run_cache
    from kvviz.policies.registry import chosen

    refuse_busy(Path(out))
    cases = spec.cases()
    for name in spec.policies:  # refuse an unknown policy, scheme, budget or model before anything runs
        chosen(available(), name)
    for name in spec.schemes:
        run_cache(name)
    for budget in spec.budgets:
        if slots_kept(budget, 1_000_000) < 1:
            raise KvvizError(f"the budget {budget!r} keeps no slot; keep at least one")
    model_source(spec.model)
    warn = warn or _stderr
    created = not os.path.lexists(out)
    folder = make_folder(Path(out))
    try:
        with locked(folder):
            found = read_rows(folder / ROWS)
            _check_manifest(folder, spec, bool(found.rows or found.problems))
            for problem in found.damaged:
                warn(f"{problem} (kept in the file; skipped)")
            done = found.rows
            _check_prompts(folder, cases, done)
            todo = [case for case in cases if case.key not in done]
            if done:  # the rows there have these settings (a manifest of an older format is written anew)
                _write_manifest(folder, spec)
            bar = _bar(len(cases), len(cases) - len(todo)) if progress else None
            with appending(folder / ROWS, found, warn) as handle:
                for row in _rows(spec.model, todo, workers, ray, batch):
                    if not done:  # the folder's settings, with its first row
                        _write_manifest(folder, spec)
                    append(handle, (json.dumps(row) + "\n").encode(), folder / ROWS)
                    done[row["key"]] = row
                    if bar is not None:
                        bar.update(1)
                    if on_row is not None:
                        on_row(row)
            if bar is not None:
                bar.close()
            keys = [case.key for case in cases if case.key in done]
            ours = set(keys)
            table = frame([done[key] for key in keys + [key for key in done if key not in ours]])  # then file order
            if done:
                replace_all({folder / CSV: lambda handle: handle.write(table.to_csv(index=False).encode()),
                             folder / PARQUET: lambda handle: table.to_parquet(handle, index=False)})
    finally:
        if created:  # a sweep that ended before its first row leaves no folder behind
            tidy_new_folder(folder)
    return table


def _stderr(text: str) -> None:
    print(f"kvviz: {text}", file=sys.stderr)


RESULT_SETTINGS = ("model", "mode", "every", "max_new_tokens", "extra")  # change every case's result: one per folder


def _manifest(spec: SweepSpec) -> dict:
    return json.loads(json.dumps({"format": FORMAT, "settings": _settings(asdict(spec))}))


def _write_manifest(folder: Path, spec: SweepSpec) -> None:
    replace(folder / MANIFEST, lambda handle: handle.write(json.dumps(_manifest(spec), indent=1).encode()))


def _check_manifest(folder: Path, spec: SweepSpec, has_rows: bool) -> None:
    """Refuse a folder holding rows of a sweep with other result-changing settings (:data:`RESULT_SETTINGS`), naming
    each. Prompts, policies, budgets, schemes and the limit may differ: the rerun adds its missing cases. A manifest
    beside no row binds nothing (an earlier sweep refused before its first row left it): it is replaced."""
    manifest = folder / MANIFEST
    settings = _manifest(spec)
    data = read_bytes(manifest)
    if data is not None and has_rows:
        try:
            held = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):  # not UTF-8, not JSON
            held = None
        if isinstance(held, dict) and isinstance(held.get("spec"), dict):  # written before sweeps could grow
            held = {"format": held.get("format"), "settings": _settings(held["spec"])}
        if not isinstance(held, dict) or held.get("format") != FORMAT or not isinstance(held.get("settings"), dict):
            raise KvvizError(f"{folder} holds another sweep (its manifest.json is not a {FORMAT} one); pass another "
                             "--out")
        other = [f"{name} {held['settings'].get(name)!r} there, {value!r} here"
                 for name, value in settings["settings"].items() if held["settings"].get(name) != value]
        if other:
            raise KvvizError(f"{folder} holds a sweep with other settings ({'; '.join(other)}): its rows cannot share "
                             "a table with these; pass another --out")


def _settings(spec: dict) -> dict:
    return {name: spec.get(name) for name in RESULT_SETTINGS}


def _check_prompts(folder: Path, cases: list[Case], done: dict[str, Row]) -> None:
    """Refuse prompts whose id names other text (turns or expected answer) in the rows the folder holds."""
    held = {row["prompt_id"]: (row.get("turns"), row.get("expected")) for row in done.values()
            if isinstance(row.get("prompt_id"), str)}
    for case in cases:
        text = held.get(case.prompt.id)
        if text is not None and text != (json.dumps(list(case.prompt.turns)), case.prompt.expected):
            raise KvvizError(f"{folder} holds rows of another prompt with the id {case.prompt.id!r} (other turns or "
                             "expected answer); give the prompt a new id or pass another --out")


def _bar(total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="sweep", unit="case", file=sys.stderr, dynamic_ncols=True)


def _rows(model: str | None, todo: list[Case], workers: int, ray: str | None, batch: int) -> Iterator[Row]:
    if not todo:
        return
    if ray is not None:
        from kvviz.sweeps.ray_pool import ray_rows

        yield from ray_rows(model, todo, workers, ray, batch)
    elif workers > 1:
        yield from _pool_rows(model, todo, workers, batch)
    else:
        from kvviz.model import load_model

        lm = load_model(model)
        for part in parts(todo, batch):  # each part's rows written as soon as they are known
            yield from run_cases(lm, part, batch)


_worker_lm = None


def _start_worker(model: str | None, threads: int) -> None:
    import torch

    from kvviz.model import load_model

    global _worker_lm
    torch.set_num_threads(threads)
    _worker_lm = load_model(model)


def _work(cases: list[Case], batch: int) -> list[Row]:
    return run_cases(_worker_lm, cases, batch)


def _pool_rows(model: str | None, todo: list[Case], workers: int, batch: int) -> Iterator[Row]:
    """The rows of ``todo`` from a local pool of ``workers`` processes (spawned: no state shared with this one), one
    task per prompt (its cases share the full-cache run)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"), _start_worker, (model, threads)) as pool:
        for future in as_completed([pool.submit(_work, group, batch) for group in by_prompt(todo)]):
            yield from future.result()
