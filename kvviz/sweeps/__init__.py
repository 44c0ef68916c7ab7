"""Sweeps: many prompts × policies × budgets as policy runs, one summary row each, ranked by damage (docs/math.md §10).

- :mod:`kvviz.sweeps.prompts` reads a JSONL prompt file or generates a built-in set (needle, key-value, variables).
- :mod:`kvviz.sweeps.cases` runs one case: a policy run and its summary row.
- :mod:`kvviz.sweeps.sweep` runs them all — in this process, a local process pool or Ray — resumably, into a table.

Its names are imported when first used (PEP 562): the command line checks a sweep's prompts and folder with
:mod:`~kvviz.sweeps.sources` and :mod:`~kvviz.sweeps.folder` before torch is loaded.
"""

from __future__ import annotations

import importlib

_HOMES = {"Case": "cases", "cases_for": "cases", "run_case": "cases", "run_cases": "cases", "Prompt": "prompts",
          "load_prompts": "sources", "SweepSpec": "sweep", "read_table": "sweep", "records": "sweep",
          "run_sweep": "sweep"}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'kvviz.sweeps' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kvviz.sweeps.{_HOMES[name]}"), name)
