"""A sweep's table read — from its folder, a ``.csv`` or a ``.parquet`` — and checked row by row. Reading never
writes: a line of ``rows.jsonl`` that is not a row, or a row that cannot be opened as its case, is left out and named
(file, line or row number, and why); the other rows are read."""

from __future__ import annotations

import io
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvviz.errors import KvvizError
from kvviz.policies.base import slots_kept
from kvviz.sweeps.cases import Row, case_of
from kvviz.sweeps.folder import PARQUET, ROWS, read_bytes, read_rows

NEEDED = ("key", "prompt_id", "family", "policy", "budget", "fraction", "mode", "every", "max_new_tokens", "kl_mean",
          "turns")  # what a row needs to be listed and opened as its case


@dataclass(frozen=True)
class Sweep:
    """A sweep's table as the Sweeps tab shows it: the rows that can be listed and opened as their cases, and each
    line or row left out, where it is and why (``DIR/rows.jsonl:3: not JSON …``, ``table.csv row 2: …``)."""

    table: pd.DataFrame
    problems: tuple[str, ...] = ()


def frame(rows: list[Row]) -> pd.DataFrame:
    """Rows as a table with nullable dtypes: a missing divergence or expected answer stays missing (``<NA>``), not a
    float NaN that would turn the steps into floats."""
    return pd.DataFrame(rows).convert_dtypes()


def records(table: pd.DataFrame) -> list[Row]:
    """A table's rows as plain Python values (missing ones None), as :func:`~kvviz.sweeps.cases.run_case` gives
    them."""
    return [{name: None if value is pd.NA else value for name, value in row.items()}
            for row in table.astype(object).to_dict("records")]


def read_table(source: str | os.PathLike) -> pd.DataFrame:
    """A sweep's table from its folder (the finished table, else the rows so far) or a ``.csv`` / ``.parquet``.
    Reads only: a line of ``rows.jsonl`` that is not a row is left out with a warning naming it, and kept."""
    table, _, problems = _load(Path(source))
    for problem in problems:
        warnings.warn(problem, stacklevel=2)
    return table


def load_sweep(source: str | os.PathLike) -> Sweep:
    """:func:`read_table`'s table checked row by row (:func:`usable`); reads only."""
    table, places, problems = _load(Path(source))
    return usable(table, places, problems, str(source))


def usable(table: pd.DataFrame, places: list[str] | None = None, problems: list[str] | tuple[str, ...] = (),
           name: str = "the table") -> Sweep:
    """The rows of ``table`` that can be listed and opened as their cases (:func:`row_problem`), and ``problems``
    followed by each row left out, named by its place (``places``, one a row; default ``NAME row N``). A table
    without the columns of a sweep's is refused."""
    if table.empty:
        return Sweep(table, tuple(problems))
    missing = [column for column in NEEDED if column not in table.columns]
    if missing:
        raise KvvizError(f"{name} is not a kvviz sweep table (missing {', '.join(missing)})")
    places = places or [f"{name} row {number}" for number in range(1, len(table) + 1)]
    whys = [row_problem(row) for row in records(table)]
    bad = [f"{place}: {why}" for place, why in zip(places, whys) if why is not None]
    if not bad:
        return Sweep(table, tuple(problems))
    good = table[[why is None for why in whys]].reset_index(drop=True)
    for column in ("budget", "kl_mean"):  # a text column (one bad value in a .csv) as the numbers it now holds
        if good[column].dtype == object:
            good[column] = good[column].astype(float)
    return Sweep(good, (*problems, *bad))


def row_problem(row: Row) -> str | None:
    """Why ``row`` cannot be listed and opened as its case — a field missing, a number that is not one or is out of
    range, turns that are not a JSON list of texts — or None when it can."""
    missing = [name for name in NEEDED if row.get(name) is None or row[name] is pd.NA or row[name] != row[name]]
    if missing:
        return f"no {', '.join(missing)}"
    for name in ("every", "max_new_tokens"):
        if not _number(row[name], int) or int(row[name]) < 1:  # type: ignore[call-overload]
            return f"{name} must be a whole number of at least 1, not {row[name]!r}"
    if not _number(row["kl_mean"], float) or float(row["kl_mean"]) != float(row["kl_mean"]):  # type: ignore[arg-type]
        return f"kl_mean must be a number, not {row['kl_mean']!r}"
    if row["fraction"] not in (True, False):
        return f"fraction must be true or false, not {row['fraction']!r}"
    try:
        turns = json.loads(row["turns"])  # type: ignore[arg-type]
    except (TypeError, ValueError, RecursionError):
        return f"turns is not JSON (a list of the prompt's texts): {str(row['turns'])[:40]!r}"
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        return "turns must be a JSON list of non-empty texts"
    try:
        slots_kept(case_of(row).budget, 1)  # a ratio in [0, 1), a fraction in (0, 1], a count of at least 0
    except KvvizError as exc:
        return str(exc)
    except (TypeError, ValueError, OverflowError):
        return f"budget must be a number, not {row['budget']!r}"
    return None


def _number(value: object, kind: type) -> bool:
    """Whether ``kind`` (int or float) reads ``value`` as a number (a .csv's text too; never a bool)."""
    try:
        kind(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return not isinstance(value, bool)


def _load(path: Path) -> tuple[pd.DataFrame, list[str], list[str]]:
    """The table at ``path``, where each of its rows is (a line of ``rows.jsonl``; none for a table file), and the
    lines that are not rows. A folder's ``table.parquet`` when it holds the rows of its ``rows.jsonl`` (else a sweep
    is writing, or stopped before writing it: the rows so far). Reads only; no file of a folder through a link."""
    if path.is_dir():
        found, parquet = read_rows(path / ROWS), read_bytes(path / PARQUET)
        if parquet is not None:
            table = pd.read_parquet(io.BytesIO(parquet))
            keys = list(table["key"]) if "key" in table else [None] * len(table)
            if not found.present or set(keys) == set(found.rows):
                places = [f"{path / ROWS}:{found.lines[key]}" if key in found.lines else f"{path / PARQUET} row {i}"
                          for i, key in enumerate(keys, start=1)]
                return table, places, found.problems
        return frame(list(found.rows.values())), [f"{path / ROWS}:{n}" for n in found.lines.values()], found.problems
    if path.suffix == ".parquet":
        return pd.read_parquet(path), [], []
    if path.suffix == ".csv":
        return pd.read_csv(path), [], []
    raise KvvizError(f"{path} is not a sweep folder, .csv or .parquet table")
