"""What the commands share: the chat flags, replaying the turns, and the ``chat --json`` document."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from typing import TYPE_CHECKING

from kvviz.errors import KvvizError
from kvviz.numbers import number, reply_length

if TYPE_CHECKING:  # imported when a command runs: the CLI answers --help and refusals without loading torch
    from kvviz.session import Session


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1 (and within int32)."""
    try:
        return int(number(text, "the value", 1, integer=True))
    except KvvizError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("the value ")) from None


def reply_tokens(text: str) -> int:
    """An argparse type: ``--max-new-tokens``, checked as the library checks it (:func:`kvviz.numbers.reply_length`)."""
    try:
        return reply_length(text)
    except KvvizError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative(text: str) -> int:
    """An argparse type: an integer of at least 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def budget(text: str) -> int | float:
    """An argparse type: a policy's budget, a slot count of at least 1 (``64``) or a fraction of the prompt in
    (0, 1] (``0.5``); NaN, infinities and 0 refused before torch loads."""
    try:
        if text.strip().lstrip("+").isdigit():
            return number(text, "a budget of slots", 1, integer=True)
        return number(text, "a fractional budget", 0, 1, above=True)
    except KvvizError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a slot count of at least 1, or a fraction in (0, 1])") from None


def ratio(text: str) -> float:
    """An argparse type: kvpress' compression ratio, a number in [0, 1) (NaN and infinities refused)."""
    try:
        return number(text, "a compression ratio", 0, 1, below=True)
    except KvvizError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def some_text(text: str) -> str:
    """An argparse type: text that is not empty (an empty calibration text would silently be the built-in one)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give some text or leave the flag out")
    return text


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags shared by ``chat`` and the commands that replay a chat first."""
    parser.add_argument("--turn", action="append", required=True, metavar="TEXT", help="a user message (repeatable)")
    parser.add_argument("--max-new-tokens", type=reply_tokens, default=64, metavar="N")
    parser.add_argument("--model", default=None, metavar="PATH", help="checkpoint folder or .gguf (default: bundled)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def replay_chat(args: argparse.Namespace, on_text: Callable[[str], None] | None = None) -> Session:
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


def chat_document(session: Session) -> dict:
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
