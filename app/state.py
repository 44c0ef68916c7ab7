"""Per-browser-session state, all in ``st.session_state``: the Session, the draft edit and the view settings."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import streamlit as st

from kvviz.draft import EditDraft
from kvviz.errors import KvvizError
from kvviz.export import export_session, import_session
from kvviz.model import cache_root
from kvviz.session import Sampling, Session

SESSION_ID = re.compile(r"^[0-9a-f]{32}$")  # the ?s= URL parameter; nothing else ever names an autosave file

MEAN = -1  # the "head" setting that means the mean over query heads

DEFAULTS = {"layer": 0, "head": MEAN, "at": None, "max_new_tokens": 48, "large": False, "notice": None,
            # the editor's settings, read before its widgets are drawn (see app/main.py's editor)
            "key_axis": "channel", "value_axis": "token", "group": 0, "symmetric": False, "pick_k": 4, "pick_v": 4,
            "topk": 10, "continuation": 0}


def init(lm) -> None:
    """Create what this browser session needs, once (``if key not in st.session_state``); after a page reload the
    autosaved session of this URL's ``?s=`` id is restored."""
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)
    if "session" in st.session_state:
        return
    sid = st.query_params.get("s", "")
    if not SESSION_ID.match(sid):
        sid = st.query_params["s"] = uuid.uuid4().hex
    st.session_state.sid = sid
    st.session_state.session, st.session_state.draft = Session(lm), EditDraft()
    path = autosave_path(sid)
    if path.is_file():
        try:
            session, draft, view = import_session(lm, json.loads(path.read_text()))
        except (KvvizError, ValueError) as exc:
            notify(f"the autosaved session could not be restored: {exc}")
        else:
            st.session_state.session, st.session_state.draft = session, draft
            st.session_state.update({k: v for k, v in view.items() if k in ("layer", "head", "at")})


def autosave_path(sid: str) -> Path:
    """``$KVVIZ_SESSIONS/<id>.json`` (default: ``sessions/`` in kvviz's cache folder)."""
    folder = os.environ.get("KVVIZ_SESSIONS") or cache_root() / "sessions"
    return Path(folder) / f"{sid}.json"


def document() -> dict:
    """This browser session as an export document (conversation, edits, view)."""
    view = {key: st.session_state[key] for key in ("layer", "head", "at")}
    return export_session(session(), draft(), view)


def save() -> None:
    """End of the editor's run (a click's, or part of a page run): keep the export current and autosave it."""
    doc = document()
    st.session_state.setdefault("export", {})["doc"] = doc  # read by the export button's deferred download
    try:
        autosave(doc)
    except OSError as exc:  # a full or read-only disk must not take the page down
        st.caption(f"Autosave failed: {exc}")


def export_json() -> Callable[[], str]:
    """The export document of the last run, for a deferred download (called outside any script run)."""
    holder = st.session_state.setdefault("export", {})
    return lambda: json.dumps(holder.get("doc", {}), ensure_ascii=False, indent=1)


def autosave(doc: dict) -> None:
    """Write ``doc`` for this URL's id when it changed (atomically: a reload never reads half a file)."""
    text = json.dumps(doc, ensure_ascii=False)
    if st.session_state.get("saved") == text or not st.session_state.get("sid"):
        return
    path = autosave_path(st.session_state.sid)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    staging.write_text(text)
    os.replace(staging, path)
    st.session_state.saved = text


def session() -> Session:
    return st.session_state.session


def draft() -> EditDraft:
    return st.session_state.draft


def new_conversation(lm, sampling: Sampling | None = None) -> None:
    st.session_state.session = Session(lm, sampling)
    st.session_state.draft = EditDraft()
    st.session_state.at = None


def step_slot() -> int:
    """The slot whose step the views show: the chosen one (time travel) or the newest cached slot."""
    newest = len(session()) - 1
    chosen = st.session_state.at
    return newest if chosen is None else max(0, min(chosen, newest))


def head() -> int | None:
    """The chosen query head, or None for the mean over heads."""
    return None if st.session_state.head == MEAN else st.session_state.head


def detail_head() -> int:
    """The head the detail views use (head 0 when the strip shows the mean)."""
    return head() or 0


def notify(message: str) -> None:
    """A message shown once at the top of the next run (e.g. a refused click, reported from a callback)."""
    st.session_state.notice = message
