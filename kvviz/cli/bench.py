"""``python -m kvviz bench``: a thin entry to the benchmark, which lives beside the library in ``benchmarks/`` (it
drives plain transformers and, for its browser rows, the app in Chromium: tooling, not library)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from kvviz.errors import KvvizError

CHECKOUT = Path(__file__).resolve().parents[2]


def _benchmarks(module: str):
    """``benchmarks.<module>`` of this checkout."""
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    try:
        return importlib.import_module(f"benchmarks.{module}")
    except ImportError:
        raise KvvizError("the benchmark is not here: run it from a checkout of kvviz (it lives in benchmarks/)") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        _benchmarks("flags").add_arguments(parser)
    except KvvizError:  # an installed kvviz without its checkout: the other commands still work, this one says why
        parser.add_argument("rest", nargs=argparse.REMAINDER)


def run(args: argparse.Namespace) -> None:
    print(_benchmarks("bench").report(args))
