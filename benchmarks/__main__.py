"""``python -m benchmarks [--quick] [--no-browser] [--only TEXT] [--repeats N] [--json]``."""

import argparse
import sys

from benchmarks.bench import report
from benchmarks.flags import add_arguments
from kvviz.errors import KvvizError

parser = argparse.ArgumentParser(prog="python -m benchmarks", description="kvviz against plain transformers")
add_arguments(parser)
try:
    print(report(parser.parse_args()))
except KvvizError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
