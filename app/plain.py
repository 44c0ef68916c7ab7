"""Text from data (files, the model, the user, exceptions) shown in elements that render Markdown.

``st.warning``, ``st.info`` and friends render Markdown and LaTeX: a quoted file field such as
``![x](http://host/x.png)`` would make the browser fetch that URL. :func:`plain` backslash-escapes every ASCII
punctuation character (CommonMark renders an escaped one literally), so such text shows as typed and runs nothing;
web addresses go into code spans, which are not turned into links.
"""

from __future__ import annotations

import re

import streamlit as st

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character
_ADDRESS = re.compile(r"(?:[a-z][a-z0-9+.-]*://|www\.)\S+", re.IGNORECASE)  # what GFM would make a link


def plain(text: object) -> str:
    """``text`` as Markdown source that renders as the text itself."""
    text, parts, last = str(text), [], 0
    for address in _ADDRESS.finditer(text):
        parts += [_PUNCTUATION.sub(r"\\\1", text[last:address.start()]), code(address.group())]
        last = address.end()
    return "".join(parts) + _PUNCTUATION.sub(r"\\\1", text[last:])


def code(text: str) -> str:
    """``text`` as a code span: fenced by one more backtick than its longest run of them."""
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def warn(text: object) -> None:
    """``st.warning`` of text that came from data (rendered literally)."""
    st.warning(plain(text))


def plural(count: int, noun: str) -> str:
    """``1 slot``, ``2 slots``: a count with its noun (regular plurals only)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def spans(numbers: list[int]) -> str:
    """Sorted numbers as runs: ``[3, 4, 5, 9]`` → ``3–5, 9``."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)
