"""A session file with Markdown, HTML and LaTeX in every string field imports into a page (AppTest) whose every view
renders without a warning and shows the text literally."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.session import Session
from kvviz.session_file import export_session, read_session
from tests.support.session_files import MARKUP, changed

APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


def test_markup_in_every_string_field_is_imported_and_every_view_renders(lm, valid_session_file, tmp_path, monkeypatch):
    session = Session(lm)
    session.add_user_turn(MARKUP)
    session.generate(4)
    draft = EditDraft.from_edit(Edit.evict([2]), MARKUP[:60])
    document = changed(export_session(session, draft, {"layer": 2, "head": 1, "at": None}), "model", MARKUP)
    read_session(lm, json.dumps(document))  # accepted
    monkeypatch.setenv("KVVIZ_SESSIONS", str(tmp_path))
    sid = "cd" * 16
    (tmp_path / f"{sid}.json").write_text(json.dumps(document))
    app = AppTest.from_file(APP, default_timeout=300)
    app.query_params["s"] = sid
    app.run()
    assert not app.exception and not app.error and not app.warning, [w.value for w in app.warning]
    assert app.session_state["session"].transcript.ids == session.transcript.ids
    assert MARKUP in [m.value for m in app.get("text")]  # the chat shows the message as plain text
