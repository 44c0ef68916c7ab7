"""The Streamlit app through AppTest: it starts, chats, and shows the cache."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app" / "main.py")


def test_app_starts_and_chats():
    app = AppTest.from_file(APP, default_timeout=120).run()
    assert not app.exception
    app.chat_input[0].set_value("Say hello.").run()
    assert not app.exception
    session = app.session_state["session"]
    assert len(session) > 0 and session.turns[0]["user"] == "Say hello."
    texts = [t.value for t in app.text]
    assert "Say hello." in texts and session.reply in texts


def test_empty_message_is_refused_inline():
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.chat_input[0].set_value("   ").run()
    assert not app.exception
    assert any("empty" in w.value for w in app.warning)
    assert len(app.session_state["session"]) == 0
