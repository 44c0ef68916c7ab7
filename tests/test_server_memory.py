"""Many sessions on one server: one memory budget, derived data dropped first, least recently used sessions released
(and restored by replay, exactly), running or unsaved sessions never released, a clear refusal when nothing fits."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from kvviz.edits import Edit
from kvviz.errors import KvvizError
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from app.server_memory import ServerMemory  # noqa: E402


def chat(lm, text: str) -> Session:
    session = Session(lm)
    session.add_user_turn(text)
    session.generate(4)
    what_if(session, Edit.evict([3]))  # a kept full run: derived data
    return session


def test_release_frees_every_tensor_and_the_file_restores_it_exactly(lm):
    session = chat(lm, "Remember the number 42.")
    document, logits, ids = export_session(session), session.logits.clone(), session.transcript.ids
    assert session.nbytes() > session.memory().kv_bytes + session.memory().recorded_bytes  # derived data counts
    held = session.release("a test")
    assert held > 0 and session.nbytes() == 0 and session.released == "a test"
    again, _, _ = import_session(lm, document)
    assert again.transcript.ids == ids and torch.equal(again.logits, logits)


def test_six_sessions_in_a_budget_of_three(lm):
    """Six people, room for three: each new turn releases the least recently used idle sessions, usage stays within
    the budget, and every released session restores with identical logits."""
    texts = [f"Remember the number {n}. What is it?" for n in (11, 22, 33, 44, 55, 66)]
    probe = chat(lm, texts[0])
    budget = 3 * probe.nbytes() + probe.nbytes() // 2
    memory, sessions, saved = ServerMemory(budget, idle_seconds=3600), [], []
    for page, text in enumerate(texts):
        memory.make_room(str(page), 60, lm.bytes_per_slot)
        memory.started(str(page), session := Session(lm), True)
        session.add_user_turn(text)
        session.generate(4)
        what_if(session, Edit.evict([3]))
        sessions.append(session)
        saved.append((export_session(session), session.logits.clone()))
        memory.finished(str(page), session, releasable=True)
        assert memory.usage() <= budget
    released = [index for index, session in enumerate(sessions) if session.released]
    assert released and released == list(range(len(released)))  # the oldest first
    assert not sessions[-1].released
    for index in released:
        again, _, _ = import_session(lm, saved[index][0])
        assert torch.equal(again.logits, saved[index][1])


def test_derived_data_goes_first_and_busy_or_unsaved_sessions_stay(lm):
    memory = ServerMemory(budget=0, idle_seconds=3600)
    busy, unsaved, idle = chat(lm, "One."), chat(lm, "Two."), chat(lm, "Three.")
    memory.started("busy", busy, True)
    memory.finished("unsaved", unsaved, releasable=False)
    memory.finished("idle", idle, releasable=True)
    memory.budget = memory.usage() - idle.memo.nbytes() + 1  # dropping the idle page's derived data is enough
    memory.make_room("me", 0, lm.bytes_per_slot)
    assert not idle.released and idle.memo.nbytes() == 0
    with pytest.raises(KvvizError, match="server's memory budget"):
        memory.make_room("me", 10**9, lm.bytes_per_slot)
    assert idle.released and not busy.released and not unsaved.released


def test_closed_and_idle_sessions_are_swept(lm):
    memory = ServerMemory(budget=10**12, idle_seconds=3600)
    closed, open_ = chat(lm, "Closed."), chat(lm, "Open.")
    memory.finished("closed", closed, releasable=True)
    memory.finished("open", open_, releasable=True)
    assert memory.sweep(lambda page: page == "open") == 0  # "closed" was never seen connected (as under AppTest)
    assert memory.sweep(lambda page: True) == 0  # now both are
    assert memory.sweep(lambda page: page == "open") == 1
    assert closed.released == "its browser closed" and not open_.released
    memory.idle_seconds = 0
    assert memory.sweep(lambda page: True) == 1 and "idle" in open_.released
    del closed, open_
    gc.collect()
    assert memory.usage() == 0


def test_a_sweep_that_cannot_tell_leaves_the_connection_as_it_was(lm):
    memory = ServerMemory(budget=10**12, idle_seconds=3600)
    page = chat(lm, "Page.")
    memory.finished("page", page, releasable=True)
    assert memory.sweep(lambda _: True) == 0  # seen connected
    assert memory.sweep(lambda _: None) == 0 and not page.released  # no server to ask: not "closed"
    assert memory.sweep(lambda _: False) == 1 and page.released == "its browser closed"


def test_apptests_stand_in_runtime_tells_nothing_about_connections(monkeypatch):
    """AppTest installs a mock Runtime during each script run and removes it after; read as an answer, the
    housekeeping thread saw every test page connect and then close, and released it under the test."""
    from unittest.mock import MagicMock

    from streamlit.runtime import Runtime

    from app import housekeeping
    monkeypatch.setattr(Runtime, "_instance", None)
    assert housekeeping.is_connected("browser/page") is None  # no server
    monkeypatch.setattr(Runtime, "_instance", MagicMock(spec=Runtime))  # AppTest's, during a run
    assert housekeeping.is_connected("browser/page") is None
    real = MagicMock(spec=Runtime)
    real.is_active_session.return_value = False  # a real runtime answers with a bool
    monkeypatch.setattr(Runtime, "_instance", real)
    assert housekeeping.is_connected("browser/page") is False
    real.is_active_session.assert_called_with("browser")


def test_a_released_page_is_restored_by_replay_with_a_line_saying_why(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_SESSIONS", str(tmp_path))
    first = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300).run()
    first.session_state["max_new_tokens"] = 4
    first.chat_input[0].set_value("Remember the number 42.").run()
    original = first.session_state["session"]
    ids, logits = original.transcript.ids, original.logits.clone()
    second = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300).run()
    memory = second.session_state["server_memory"]
    budget = memory.budget
    try:
        memory.budget = 8 * 2**20  # room for one small conversation
        second.session_state["max_new_tokens"] = 4
        second.chat_input[0].set_value("Hello there.").run()
        assert not second.exception and not second.warning
        assert original.released  # the first page's session made room
    finally:
        memory.budget = budget
    first.run()  # its person comes back
    restored = first.session_state["session"]
    assert restored is not original and restored.transcript.ids == ids and torch.equal(restored.logits, logits)
    assert any("set aside to free the server" in w.value for w in first.warning)


def test_a_released_session_refuses_to_run_or_be_saved(lm):
    from kvviz.session_file import export_session as export

    session = chat(lm, "Soon released.")
    session.release("a test")
    for action in (session.step, lambda: session.add_user_turn("More."), lambda: session.commit(Edit.evict([2])),
                   lambda: export(session)):
        with pytest.raises(KvvizError, match="released"):
            action()


def test_autosave_writes_are_revisioned_private_and_refuse_another_tabs_revision(tmp_path):
    from app import autosave

    path = tmp_path / "sessions" / "ab.json"
    assert autosave.write(path, '{"a": 1}', None) == 1
    assert autosave.write(path, '{"a": 2}', 1) == 2
    with pytest.raises(autosave.Conflict):
        autosave.write(path, '{"a": 3}', 1)  # this page last saw revision 1; another tab wrote 2
    assert path.read_text() == '{"revision": 2, "a": 2}' and (path.stat().st_mode & 0o777) == 0o600
    assert (path.parent.stat().st_mode & 0o777) == 0o700 and not list(path.parent.glob(".*.tmp"))
