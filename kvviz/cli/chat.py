"""``python -m kvviz chat``: run turns and print every cached slot (or one JSON document)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvviz.cli.common import add_chat_arguments, chat_document, replay_chat
from kvviz.errors import KvvizError
from kvviz.spelling import spell


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_chat_arguments(parser)
    parser.add_argument("--save", type=Path, default=None, metavar="SESSION.json",
                        help="also write the session file the app exports (for replay, the app's import, export-page)")


def print_transcript(document: dict) -> None:
    print(f"model: {document['model']} on {document['device']}; cache length {document['cache_length']}")
    for row in document["tokens"]:
        print(f"{row['slot']:>5} pos {row['position']:>5}  turn {row['turn']:>2}  {row['segment']:<9}  "
              f"{row['id']:>6}  {spell(row['text'])}")
    if document["pending"]:
        print(f"pending (not cached): {document['pending']['id']} {spell(document['pending']['text'])}")


def run(args: argparse.Namespace) -> None:
    def echo(text: str) -> None:
        print(text, end="", flush=True)

    session = replay_chat(args, None if args.json else echo)
    if args.save is not None:
        from kvviz.session_file import export_session

        try:
            args.save.write_text(json.dumps(export_session(session), ensure_ascii=False), encoding="utf-8")
        except OSError as exc:
            raise KvvizError(f"cannot write {args.save}: {exc.strerror}") from None
    document = chat_document(session)
    if args.json:
        print(json.dumps(document, ensure_ascii=False))
    else:
        print()
        print_transcript(document)
