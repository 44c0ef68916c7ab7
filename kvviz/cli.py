"""Command line: ``python -m kvviz {prepare,chat} …``. Errors are one line on stderr and a non-zero exit status."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from kvviz import cli_whatif
from kvviz.errors import KvvizError


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags shared by ``chat`` and the commands that replay a chat first."""
    parser.add_argument("--turn", action="append", required=True, metavar="TEXT", help="a user message (repeatable)")
    parser.add_argument("--max-new-tokens", type=_positive, default=64, metavar="N")
    parser.add_argument("--model", default=None, metavar="PATH", help="checkpoint folder or .gguf (default: bundled)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def replay_chat(args: argparse.Namespace, on_text: Callable[[str], None] | None = None):
    """Load the model and run ``args.turn`` in order; returns the session."""
    from kvviz.model import load_model
    from kvviz.session import Session

    if any(not text.strip() for text in args.turn):
        raise KvvizError("a turn is empty; type some text")
    session = Session(load_model(args.model))
    for text in args.turn:
        session.add_user_turn(text)
        for token in session.stream(args.max_new_tokens):
            if on_text is not None:
                on_text(token.text)
    return session


def chat_document(session) -> dict:
    """The ``chat --json`` document (field names are relied on by other tools)."""
    pending = session.pending_token()
    return {
        "model": session.lm.name,
        "device": session.lm.device_label,
        "tokens": session.transcript.rows(),
        "pending": None if pending is None else {"id": pending.id, "text": pending.text},
        "turns": session.conversation(),
        "cache_length": len(session),
    }


def _print_transcript(document: dict) -> None:
    print(f"model: {document['model']} on {document['device']}; cache length {document['cache_length']}")
    for row in document["tokens"]:
        print(f"{row['slot']:>5} pos {row['position']:>5}  turn {row['turn']:>2}  {row['segment']:<9}  "
              f"{row['id']:>6}  {row['text']!r}")
    if document["pending"]:
        print(f"pending (not cached): {document['pending']['id']} {document['pending']['text']!r}")


def run_chat(args: argparse.Namespace) -> None:
    def echo(text: str) -> None:
        print(text, end="", flush=True)

    session = replay_chat(args, None if args.json else echo)
    document = chat_document(session)
    if args.json:
        print(json.dumps(document, ensure_ascii=False))
    else:
        print()
        _print_transcript(document)


def run_prepare(args: argparse.Namespace) -> None:
    from kvviz.model import load_model

    lm = load_model(args.model)
    print(f"ready: {lm.name} on {lm.device_label}")


def run_bench(args: argparse.Namespace) -> None:
    from kvviz.bench import run, table

    report = run(quick=args.quick, browser=not args.no_browser, only=args.only, repeats=args.repeats)
    print(json.dumps(report) if args.json else table(report))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvviz", description="See and edit the KV cache of a real model.")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="convert the model once (safetensors cache) and check it loads")
    prepare.add_argument("--model", default=None, metavar="PATH")
    prepare.set_defaults(run=run_prepare)
    chat = commands.add_parser("chat", help="run turns and print the transcript of the cache")
    add_chat_arguments(chat)
    chat.set_defaults(run=run_chat)
    whatif = commands.add_parser("whatif", help="replay a chat, then compare the full and an edited cache at a step")
    add_chat_arguments(whatif)
    cli_whatif.add_arguments(whatif)
    whatif.set_defaults(run=cli_whatif.run_whatif)
    bench = commands.add_parser("bench", help="benchmark against plain transformers (ratios, targets, pass/fail)")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--quick", action="store_true", help="no 4k contexts and no browser rows")
    bench.add_argument("--no-browser", action="store_true", help="skip the browser rows")
    bench.add_argument("--only", action="append", default=[], metavar="TEXT",
                       help="only the rows whose name contains TEXT (repeatable), e.g. --only quant")
    bench.add_argument("--repeats", type=int, default=5, metavar="N", help="medians of at least N (default 5)")
    bench.set_defaults(run=run_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
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
