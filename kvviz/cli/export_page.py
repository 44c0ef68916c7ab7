"""``python -m kvviz export-page SESSION.json --out PAGE.html``: a session file (the app's export or autosave, or
``chat --save``) as one standalone HTML page that opens offline (see :mod:`kvviz.figures.standalone_page`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvviz.cli.replay import read_document
from kvviz.errors import KvvizError


def _head(text: str) -> int | None:
    if text == "mean":
        return None
    try:
        return int(text)
    except ValueError:
        raise KvvizError(f"a head is a number or 'mean', got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="SESSION.json", help="a session file (export, autosave, chat --save)")
    parser.add_argument("--out", type=Path, required=True, metavar="PAGE.html")
    parser.add_argument("--layer", type=int, action="append", default=[], metavar="L",
                        help="a layer whose attention of every step the page holds (repeatable; default: the file's)")
    parser.add_argument("--head", type=_head, action="append", default=[], metavar="H|mean",
                        help="query heads of those layers (repeatable; default: the mean of heads)")
    parser.add_argument("--model", default=None, metavar="PATH", help="checkpoint folder or .gguf (default: bundled)")


def run(args: argparse.Namespace) -> None:
    document = read_document(args.file, args.model)
    from kvviz.model import load_model
    from kvviz.session_file import import_session
    from kvviz.figures.standalone_page import page_data, prepared_edits, standalone_html

    session, draft, view = import_session(load_model(args.model), document)
    layers = args.layer or [int(view.get("layer", 0))]
    heads = args.head or [None]
    views = [(layer, head) for layer in layers for head in heads]
    detail = (layers[0], next((h for h in heads if h is not None), 0))
    prepared = prepared_edits(view, draft, len(session))
    html = standalone_html(page_data(session, prepared, views, detail, title=f"kvviz — {args.file.stem}"))
    try:
        args.out.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise KvvizError(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"wrote {args.out} ({len(html.encode()):,} bytes): {len(session)} slots, {len(views)} attention views, "
          f"{len(prepared)} prepared edits")
