"""``python -m kvviz prepare``: convert the model once (safetensors cache) and check that it loads."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="PATH")


def run(args: argparse.Namespace) -> None:
    from kvviz.model import load_model

    lm = load_model(args.model)
    print(f"ready: {lm.name} on {lm.device_label}")
