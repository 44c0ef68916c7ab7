"""Autosave never loses work: a refused restore keeps the file, two tabs on one id do not overwrite each other, a
message is saved when it is sent, ids are full matches, files are owner-only, and file text is never Markdown."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


@pytest.fixture
def sessions(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KVVIZ_SESSIONS", str(tmp_path))
    return tmp_path


def open_page(sid: str | None = None) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=300)
    if sid is not None:
        app.query_params["s"] = sid
    return app.run()


def button(app: AppTest, label: str):
    return next(b for b in app.button if b.label == label)


def chatted(message: str = "Remember the number 42.") -> tuple[AppTest, str]:
    app = open_page()
    app.session_state["max_new_tokens"] = 4
    app.chat_input[0].set_value(message).run()
    assert not app.exception
    return app, app.query_params["s"]


def test_a_refused_restore_leaves_the_autosave_byte_for_byte(sessions, monkeypatch):
    original, sid = chatted()
    path = sessions / f"{sid}.json"
    saved = path.read_bytes()
    assert json.loads(saved)["turns"]
    monkeypatch.setenv("KVVIZ_MEMORY_BUDGET_MB", "0.01")  # too small for the saved conversation
    app = open_page(sid)
    assert not app.exception
    assert any("could not be restored" in w.value for w in app.warning)
    assert len(app.session_state["session"]) == 0
    app.run()  # the empty page's editor runs again: it must not save over the file
    assert path.read_bytes() == saved
    button(app, "Try the restore again").click().run()
    assert path.read_bytes() == saved and any("could not be restored" in w.value for w in app.warning)
    button(app, "Start a new conversation under a new id").click().run()
    assert app.query_params["s"] != sid and not app.warning
    assert path.read_bytes() == saved
    monkeypatch.setenv("KVVIZ_MEMORY_BUDGET_MB", "4096")
    again = open_page(sid)  # the file still restores once the budget allows it
    assert again.session_state["session"].transcript.ids == original.session_state["session"].transcript.ids


def test_two_tabs_on_one_id_never_overwrite_each_other(sessions):
    first, sid = chatted()
    second = open_page(sid)  # the same URL in another tab: restored from the file
    assert second.session_state["session"].transcript.ids == first.session_state["session"].transcript.ids
    first.chat_input[0].set_value("And one more thing.").run()
    path = sessions / f"{sid}.json"
    after_first = path.read_bytes()
    assert len(json.loads(after_first)["turns"]) == 2
    second.session_state["draft"].toggle_evicted(3)
    second.run()  # its autosave would drop the first tab's second turn
    assert path.read_bytes() == after_first
    assert any("another tab" in w.value for w in second.warning)
    button(second, "Keep this page's version under a new id").click().run()
    moved = json.loads((sessions / f"{second.query_params['s']}.json").read_text())
    assert len(moved["turns"]) == 1 and moved["draft"]["edit"]["evict"][0]["slots"] == [3]
    assert path.read_bytes() == after_first
    button(first, "Evict this turn").click().run()  # the first tab keeps saving its own file
    assert json.loads(path.read_bytes())["revision"] > json.loads(after_first)["revision"]


def test_the_message_is_saved_before_the_reply_ends(sessions, monkeypatch):
    from kvviz.session import Session

    original = Session.stream

    def killed(self, max_new_tokens):
        for index, token in enumerate(original(self, max_new_tokens)):
            if index == 2:
                raise RuntimeError("the server was killed")
            yield token

    monkeypatch.setattr(Session, "stream", killed)
    app = open_page()
    app.chat_input[0].set_value("Please keep this message.").run()
    saved = json.loads((sessions / f"{app.query_params['s']}.json").read_text())
    assert saved["turns"][0]["user"] == "Please keep this message."
    assert saved["turns"][0]["prefill_ids"]


def test_session_ids_are_full_matches_and_files_are_private(sessions):
    app = open_page("0123456789abcdef0123456789abcdef\n")
    assert app.query_params["s"] != "0123456789abcdef0123456789abcdef\n"
    assert len(app.query_params["s"]) == 32 and "\n" not in app.query_params["s"]
    _, sid = chatted()
    assert stat.S_IMODE((sessions / f"{sid}.json").stat().st_mode) == 0o600
    nested = sessions / "nested"
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("KVVIZ_SESSIONS", str(nested))
    try:
        chatted()
    finally:
        monkeypatch.undo()
    assert stat.S_IMODE(nested.stat().st_mode) == 0o700


def test_text_from_a_file_is_never_markdown(sessions):
    sid = "ab" * 16
    (sessions / f"{sid}.json").write_text(json.dumps(
        {"format": "kvviz-session", "version": "![x](http://example.com/x.png) $x^2$ **bold**"}))
    app = open_page(sid)
    shown = next(w.value for w in app.warning if "could not be restored" in w.value)
    assert r"\!\[x\]\(`http://example.com/x.png)`" in shown and r"\$x\^2\$" in shown and r"\*\*bold\*\*" in shown
