"""What the session-file tests share: a real session's file (``valid_session_file``, made once per test process), a
copy of one with a field changed, and text that is Markdown, HTML and LaTeX at once."""

from __future__ import annotations

import copy

import pytest

from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.session import Session
from kvviz.session_file import export_session

MARKUP = "![x](http://example.com/x.png) <img src=x onerror=alert(1)> $\\frac{a}{b}$ **bold** [link](http://e.com)"


@pytest.fixture(scope="session")
def valid_session_file(lm) -> dict:
    """A real session's file: two turns, a committed eviction, a draft with bits and a policy's name."""
    session = Session(lm)
    session.add_user_turn("My name is Ada.")
    session.generate(4)
    session.commit(Edit.evict([3]))
    session.add_user_turn("What is my name?")
    session.generate(4)
    draft = EditDraft.from_edit(Edit.quantize([5, 6], 4), "h2o", {"recent_fraction": 0.5})
    return export_session(session, draft, {"layer": 2, "head": 1, "at": None})


def changed(document: dict, path: str, value) -> dict:
    """A copy of ``document`` with the field at ``path`` (dots; numbers index lists) set to ``value``."""
    result = copy.deepcopy(document)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target = result
    for part in parents:
        target = target[part]
    target[last] = value
    return result
