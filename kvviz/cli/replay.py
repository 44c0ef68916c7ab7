"""``python -m kvviz replay SESSION.json``: replay a session file with the app's own import checks (the same code:
:func:`~kvviz.session_schema.check_file`, :func:`kvviz.session_file.import_session`)
and print its transcript like ``chat``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvviz.cli.chat import print_transcript
from kvviz.cli.common import chat_document
from kvviz.checkpoint import located_geometry
from kvviz.errors import KvvizError
from kvviz.session_schema import MAX_BYTES, CheckedFile, check_file, parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="SESSION.json", help="a session file (export or autosave)")
    parser.add_argument("--model", default=None, metavar="PATH", help="checkpoint folder or .gguf (default: bundled)")
    parser.add_argument("--json", action="store_true", help="print one JSON document (as chat --json)")


def read_document(path: Path, model: str | None) -> CheckedFile | dict:
    """A session file's document, parsed with the app's limits and, when the model's shape is known without loading
    it, checked against it (a refusal before the slow imports and load)."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise KvvizError(f"cannot import this session: the file has {path.stat().st_size:,} bytes, over "
                             f"the limit of {MAX_BYTES:,}")
        text = path.read_bytes()
    except OSError as exc:
        raise KvvizError(f"cannot read {path}: {exc.strerror}") from None
    geometry = located_geometry(model)
    return parse(text) if geometry is None else check_file(geometry, text)  # import checks a parsed one, once


def run(args: argparse.Namespace) -> None:
    document = read_document(args.file, args.model)
    from kvviz.model import load_model
    from kvviz.session_file import import_session

    session, _, _ = import_session(load_model(args.model), document)
    document = chat_document(session)
    if args.json:
        print(json.dumps(document, ensure_ascii=False))
    else:
        print_transcript(document)
