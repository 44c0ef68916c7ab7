"""Server-side bookkeeping without a model: AppTest's stand-in runtime tells nothing about connections, and autosave
writes are revisioned, owner-only and refuse another tab's revision."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


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


def test_autosave_writes_are_revisioned_private_and_refuse_another_tabs_revision(tmp_path):
    from app import autosave

    path = tmp_path / "sessions" / "ab.json"
    assert autosave.write(path, '{"a": 1}', None) == 1
    assert autosave.write(path, '{"a": 2}', 1) == 2
    with pytest.raises(autosave.Conflict):
        autosave.write(path, '{"a": 3}', 1)  # this page last saw revision 1; another tab wrote 2
    assert path.read_text() == '{"revision": 2, "a": 2}' and (path.stat().st_mode & 0o777) == 0o600
    assert (path.parent.stat().st_mode & 0o777) == 0o700 and not list(path.parent.glob(".*.tmp"))
