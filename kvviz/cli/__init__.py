"""Command line: ``python -m kvviz {prepare,chat,replay,whatif,quant-compare,export-page,policy-run,sweep,bench} …``, one module per command. Errors are one line on
stderr and a non-zero exit status, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvviz.cli import bench, chat, export_page, policy_run, prepare, quant_compare, replay, sweep, whatif
from kvviz.errors import KvvizError

COMMANDS = {
    "prepare": (prepare, "convert the model once (safetensors cache) and check it loads"),
    "chat": (chat, "run turns and print the transcript of the cache"),
    "replay": (replay, "replay a session file (the app's import checks) and print its transcript"),
    "whatif": (whatif, "replay a chat, then compare the full and an edited cache at a step"),
    "quant-compare": (quant_compare, "replay a chat, then several quantization schemes at one step, one row each"),
    "export-page": (export_page, "a session file as one standalone HTML page that opens offline"),
    "policy-run": (policy_run, "answer with the full cache and with a policy compressing it as it runs; blame"),
    "sweep": (sweep, "policy runs over many prompts × policies × budgets into one table, resumable"),
    "bench": (bench, "benchmark against plain transformers (ratios, targets, pass/fail)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvviz", description="See and edit the KV cache of a real model.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (module, summary) in COMMANDS.items():
        command = commands.add_parser(name, help=summary)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.run(args)
    except KvvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a traceback on the command line
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
