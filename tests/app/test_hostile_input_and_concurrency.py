"""Hardening of the page under AppTest: a reload restores the last session, a foreign ``?s=`` id never names a file,
a group size that does not divide is an inline warning."""

from __future__ import annotations

from pathlib import Path

import torch
from streamlit.testing.v1 import AppTest


APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


def test_reload_restores_the_last_session(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_SESSIONS", str(tmp_path))
    app = AppTest.from_file(APP, default_timeout=300).run()
    app.chat_input[0].set_value("Remember the number 42.").run()
    app.session_state["draft"].toggle_evicted(4)
    app.run()
    sid = app.query_params["s"]
    assert (tmp_path / f"{sid}.json").is_file()
    original = app.session_state["session"]
    reloaded = AppTest.from_file(APP, default_timeout=300)
    reloaded.query_params["s"] = sid
    reloaded.run()
    assert not reloaded.exception
    restored = reloaded.session_state["session"]
    assert restored.transcript.ids == original.transcript.ids
    assert torch.equal(restored.logits, original.logits)
    assert reloaded.session_state["draft"].evicted == {4}


def test_foreign_session_id_never_names_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_SESSIONS", str(tmp_path))
    app = AppTest.from_file(APP, default_timeout=300)
    app.query_params["s"] = "../../etc/passwd"
    app.run()
    assert not app.exception
    assert app.query_params["s"] != "../../etc/passwd" and len(app.query_params["s"]) == 32


def test_group_size_that_does_not_divide_is_an_inline_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_SESSIONS", str(tmp_path))
    app = AppTest.from_file(APP, default_timeout=300).run()
    app.chat_input[0].set_value("Hi").run()
    app.number_input(key="group").set_value(5).run()
    assert not app.exception and not app.error
    assert any("does not divide the head dimension 64" in w.value for w in app.warning)
    app.number_input(key="group").set_value(16).run()
    assert not any("does not divide" in w.value for w in app.warning)
