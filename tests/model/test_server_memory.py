"""Many sessions on one server's memory budget, on the bundled model: derived data dropped first, least recently used
sessions released (and restored by replay, exactly), running or unsaved sessions never released, a clear refusal
when nothing fits, closed and idle sessions swept."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if

ROOT = Path(__file__).resolve().parents[2]
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


def test_a_released_session_refuses_to_run_or_be_saved(lm):
    from kvviz.session_file import export_session as export

    session = chat(lm, "Soon released.")
    session.release("a test")
    for action in (session.step, lambda: session.add_user_turn("More."), lambda: session.commit(Edit.evict([2])),
                   lambda: export(session)):
        with pytest.raises(KvvizError, match="released"):
            action()


def test_a_page_seen_connected_stays_so_when_it_shows_another_session(lm):
    """A page released to make room restores itself into a new session object; closed within the next sweep's 5 s,
    it was released only at the idle limit (15 min: +400 MB on the load run 30 s after every page closed)."""
    memory = ServerMemory(budget=10**12, idle_seconds=3600)
    first = chat(lm, "Set aside.")
    memory.finished("page", first, releasable=True)
    assert memory.sweep(lambda _: True) == 0  # the page is seen connected
    memory.budget = 0
    with pytest.raises(KvvizError):
        memory.make_room("other", 10, lm.bytes_per_slot)  # releases the page's session, and still refuses
    assert first.released
    memory.budget = 10**12
    assert memory.sweep(lambda _: True) == 0  # its released session's entry is no reason to forget the page
    restored = chat(lm, "Set aside.")  # the page's next run restores it
    assert not memory.started("page", restored, True)
    memory.finished("page", restored, releasable=True)
    assert memory.sweep(lambda _: False) == 1 and restored.released == "its browser closed"


class Kept:
    """What a page keeps beside its session (a stand-in for the page's state under app.server_memory.KEPT)."""

    def __init__(self, nbytes: int):
        self.values = {"policy_run": torch.zeros(nbytes // 4)}
        self.dropped = 0

    def __call__(self):
        return sum(v.nbytes for v in self.values.values()), self.drop

    def drop(self):
        self.values.clear()
        self.dropped += 1


def test_the_budget_counts_what_a_page_keeps_and_a_release_drops_it(lm):
    kept = Kept(8 * 2**20)
    memory = ServerMemory(budget=10**12, idle_seconds=3600, kept=kept)
    session = chat(lm, "A policy run's page.")
    memory.finished("page", session, releasable=True)
    assert memory.usage() == session.nbytes() + 8 * 2**20
    memory.budget = memory.usage() + 2**20  # the next turn's room is only there once the kept run goes too
    memory.make_room("other", 2**21 // lm.bytes_per_slot + 1, lm.bytes_per_slot)
    assert session.released and kept.dropped == 1 and not kept.values and memory.usage() <= memory.budget


def test_kept_results_that_cannot_be_dropped_stay_counted(lm):
    memory = ServerMemory(budget=10**12, idle_seconds=3600, kept=lambda: (5 * 2**20, None))
    session = chat(lm, "No server to drop it.")
    memory.finished("page", session, releasable=True)
    memory.sweep(lambda _: True)
    assert memory.sweep(lambda _: False) == 1 and session.released
    assert memory.usage() == 5 * 2**20


def test_page_kept_counts_the_pages_results_not_the_model_and_drops_them_from_its_state(lm, monkeypatch):
    from types import SimpleNamespace
    from unittest.mock import MagicMock

    from streamlit.runtime import Runtime
    from streamlit.runtime.app_session import AppSession, AppSessionState
    from streamlit.runtime.state import SafeSessionState, SessionState

    from app import server_memory
    from kvviz.policies.base import Ratio
    from kvviz.policies.h2o import H2O
    from kvviz.runs.compressed import RunSettings
    from kvviz.runs.policy_run import run_policy

    # a run holds a compressed session per turn, whose session holds the (shared) model
    result = run_policy(lm, ["Hi."], RunSettings(H2O(), Ratio(0.5)), 2)
    state = SessionState()
    state["policy_run"], state["layer"] = result, 3
    page = AppSession.__new__(AppSession)  # only its state is read
    page._session_state, page._state = state, AppSessionState.SHUTDOWN_REQUESTED  # (its __del__ shuts nothing)
    real = MagicMock(spec=Runtime)
    real.get_app_session.side_effect = lambda sid: page if sid == "browser" else None
    monkeypatch.setattr(Runtime, "_instance", real)
    context = SimpleNamespace(session_id="browser", session_state=SafeSessionState(state, lambda: None))
    monkeypatch.setattr(server_memory, "get_script_run_ctx", lambda suppress_warning=False: context)
    held, drop = server_memory.page_kept(lm)()
    cache = result.turns[0].forced.session.cache.layers[0]
    assert held >= result.turns[0].full_logits.nbytes + cache.keys.untyped_storage().nbytes()
    assert held < sum(p.nbytes for p in lm.model.parameters()) // 4  # the shared model is not the page's
    drop()
    assert "policy_run" not in state and state["layer"] == 3
    monkeypatch.setattr(Runtime, "_instance", MagicMock(spec=Runtime))  # AppTest's stand-in: counted, not dropped
    state["policy_run"] = result
    assert server_memory.page_kept(lm)() == (held, None)
