"""The benchmark's command-line flags (light: ``python -m kvviz`` builds its parser without the benchmark's imports)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``python -m benchmarks`` and ``python -m kvviz bench``."""
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="no 4k contexts and no browser rows")
    parser.add_argument("--no-browser", action="store_true", help="skip the browser rows")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only the rows whose name contains TEXT (repeatable), e.g. --only quant")
    parser.add_argument("--repeats", type=int, default=5, metavar="N", help="medians of at least N (default 5)")
