"""Many pages under AppTest on one server: a released page is restored by replay with a line saying why, and a page
reports the results it keeps to the server's budget."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from streamlit.testing.v1 import AppTest


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def test_a_released_page_is_restored_by_replay_with_a_line_saying_why(tmp_path, monkeypatch):
    """Two pages on a server of their own: pages that earlier tests of this process opened stay registered in the
    shared budget (a test module may hold its pages), so the server's resources are made anew (the model reloads)."""
    import streamlit as st

    st.cache_resource.clear()
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


def test_the_page_reports_its_kept_results_to_the_servers_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_SESSIONS", str(tmp_path))
    page = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300).run()
    page.session_state["policy_blame"] = torch.zeros(2**20)  # kept, shown only beside a policy run
    page.run()
    memory, session = page.session_state["server_memory"], page.session_state["session"]
    entry = next(e for e in memory._entries.values() if e.session() is session)
    assert entry.kept == 4 * 2**20 and entry.bytes == session.nbytes() + 4 * 2**20
