"""The one way a token is written wherever kvviz shows it (strip, tables, menus, tooltips, figures, the CLI).

A token's piece (:func:`kvviz.transcript.token_pieces`) is its text as the model holds it. Shown raw, a space, a
line break or a lone UTF-8 byte is invisible or shown as something else; shown as a Python repr, it gets quotes and
backslashes. :func:`spell` makes every character visible and keeps the text otherwise as it is:

- a space at either end ``␣`` (one per space; spaces inside a piece stay spaces), a line break ``↵``, a tab ``⇥``;
- a byte that is not a whole UTF-8 character on its own (byte-level BPE splits emoji and CJK over tokens, and the
  piece holds it as the escape ``\\xNN``), and each byte of any other invisible character (control and format
  characters, other spaces, line and paragraph separators) as ``<0xNN>``, the byte-fallback tokens' own spelling;
- an empty piece ``∅``, so no table cell or chip is ever blank.
"""

from __future__ import annotations

import re
import unicodedata

SPACE, NEWLINE, TAB, EMPTY = "␣", "↵", "⇥", "∅"
_ESCAPED_BYTE = re.compile(r"\\x([0-9a-fA-F]{2})")  # token_pieces' backslashreplace for a partial UTF-8 character
_INVISIBLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}  # control, format, surrogate, unassigned, separators


def _bytes_of(char: str) -> str:
    return "".join(f"<0x{b:02X}>" for b in char.encode("utf-8", "surrogatepass"))


def _char(char: str) -> str:
    if char == "\n":
        return NEWLINE
    if char == "\t":
        return TAB
    if char != " " and unicodedata.category(char) in _INVISIBLE:
        return _bytes_of(char)
    return char


def spell(piece: str) -> str:
    """``piece`` written visibly: ``" Rex"`` → ``"␣Rex"``, ``"\\n\\n"`` → ``"↵↵"``, ``"\\xe2"`` → ``"<0xE2>"``,
    ``""`` → ``"∅"`` (see the module docstring)."""
    if not piece:
        return EMPTY
    inner = piece.strip(" ")
    left = len(piece) - len(piece.lstrip(" "))
    right = len(piece) - left - len(inner)
    body = "".join(_char(c) for c in inner)
    body = _ESCAPED_BYTE.sub(lambda m: f"<0x{m.group(1).upper()}>", body)
    return SPACE * left + body + SPACE * right


def spell_slot(slot: int, piece: str) -> str:
    """A slot named with its token: ``12 ␣Rex`` (axis labels, menus, hovers)."""
    return f"{slot} {spell(piece)}"


_UNSAFE = _INVISIBLE - {"Zs"}  # what a terminal may act on (escape sequences, bidi overrides); spaces print as such
_LINES = {"\n", "\r", "\t"}


def printable(text: str, lines: bool = False) -> str:
    """Text from a file, a user or the model as it may be printed on a terminal: each control, format, private or
    unassigned character written as an escape that JSON and Python both read (``"\x1b]0;title\x07"`` →
    ``"\\u001b]0;title\\u0007"``), every other character as it is; ``lines`` keeps line breaks, carriage returns
    and tabs (a whole output, not one field). Whatever a prompt id, a path or a reply holds, the terminal shows it and
    acts on none of it: no title set, no screen cleared, no clipboard written."""
    return "".join(c if not _unsafe(c) or (lines and c in _LINES) else _escape(c) for c in text)


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in _UNSAFE


def _escape(char: str) -> str:
    data = char.encode("utf-16-be", "surrogatepass")  # above U+FFFF: a surrogate pair, as JSON writes it
    return "".join(f"\\u{int.from_bytes(data[i:i + 2], 'big'):04x}" for i in range(0, len(data), 2))


class PrintableStream:
    """A text stream (``sys.stdout``, ``sys.stderr``) that writes everything through :func:`printable` (lines kept):
    what the command line prints can never act on the terminal."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(printable(text, lines=True))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)
