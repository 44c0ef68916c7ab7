"""Command line: ``python -m kvviz {prepare,chat,replay,whatif,quant-compare,export-page,policy-run,sweep,bench} …``,
one module per command. Errors are one line on stderr and a non-zero exit status (2: a refused input), never a
traceback; everything printed goes through :func:`kvviz.spelling.printable`, so no text from a file, a user's code
or the model reaches the terminal as an escape sequence."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvviz.cli import bench, chat, export_page, policy_run, prepare, quant_compare, replay, sweep, whatif
from kvviz.errors import KvvizError
from kvviz.spelling import PrintableStream, printable

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
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(sys.stdout), PrintableStream(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = streams


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)  # argparse's own refusals and --help exit here (status 2, 0)
    try:
        args.run(args)
    except SystemExit as exc:  # no command exits: code of the user's it ran did (caught and named where it is called)
        print(f"error: code the command ran called sys.exit({printable(repr(exc.code))}) (a press or policy file?); "
              "the command did not finish", file=sys.stderr)
        return 2
    except KvvizError as exc:
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a traceback on the command line
        print(f"error: {type(exc).__name__}: {printable(str(exc))}", file=sys.stderr)
        return 1
    return 0
