"""Sweeps: many prompts × policies × budgets as policy runs, one summary row each, ranked by damage (docs/math.md §10).

- :mod:`kvviz.sweeps.prompts` reads a JSONL prompt file or generates a built-in set (needle, key-value, variables).
- :mod:`kvviz.sweeps.cases` runs one case: a policy run and its summary row.
- :mod:`kvviz.sweeps.sweep` runs them all — in this process, a local process pool or Ray — resumably, into a table.
"""

from kvviz.sweeps.cases import Case, cases_for, run_case, run_cases
from kvviz.sweeps.prompts import Prompt
from kvviz.sweeps.sources import load_prompts
from kvviz.sweeps.sweep import SweepSpec, read_table, records, run_sweep

__all__ = ["Case", "Prompt", "SweepSpec", "cases_for", "load_prompts", "read_table", "records", "run_case", "run_cases",
           "run_sweep"]
