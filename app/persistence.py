"""A page's session over its life: started new or restored from the autosave of its URL's id, saved as it changes
(atomically, never over another tab's newer save: then autosaving is held), released by the server between runs and
restored when the page runs again, loaded from a file, begun anew."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import streamlit as st

from app import autosave, state
from app.plain import plain
from app.progress import replay_progress
from app.server_memory import ServerMemory
from kvviz import settings
from kvviz.edit.draft import EditDraft
from kvviz.model import LoadedModel, cache_root
from kvviz.sampling import Sampling
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.session_schema import check_file


def init(lm: LoadedModel, memory: ServerMemory) -> None:
    """Create what this browser session needs, once (``if key not in st.session_state``); after a page reload the
    autosaved session of this URL's ``?s=`` id is restored, and so is a session the server released meanwhile."""
    for key, value in state.DEFAULTS.items():
        st.session_state.setdefault(key, value)
    st.session_state.server_memory = memory
    if "session" in st.session_state:
        released = state.session().released
        if released:
            # a fresh session first: a restore that is refused or stopped leaves a page that works (and holds the file)
            st.session_state.session, st.session_state.draft = Session(lm), EditDraft()
            restore(lm)
            if not held():
                state.notify(f"This conversation was set aside to free the server's memory ({released}) and has "
                             "been restored from its autosave.")
        begin_run(whole_page=True)
        return
    sid = st.query_params.get("s", "")
    if not state.SESSION_ID.fullmatch(sid):
        sid = st.query_params["s"] = uuid.uuid4().hex
    st.session_state.sid = sid
    st.session_state.session, st.session_state.draft = Session(lm), EditDraft()
    st.session_state.held, st.session_state.revision = None, None
    restore(lm)
    begin_run(whole_page=True)


def begin_run(whole_page: bool = False) -> None:
    """This page's session is in use until :func:`end_run` (the server never releases it meanwhile). A session the
    server released just before is restored by a new run of the whole page; a fragment's run after a callback set
    ``whole_page`` (a layer and head chosen for every view) becomes the whole page's."""
    memory = st.session_state.get("server_memory")
    if (st.session_state.pop("whole_page", False) and not whole_page
            or memory is not None and memory.started(state.page(), state.session(), whole_page)):
        st.rerun(scope="app")


def end_run() -> None:
    """The run of the page (or of its fragment) is over: the server may release the session if its autosave holds
    it."""
    memory = st.session_state.get("server_memory")
    if memory is not None:
        memory.finished(state.page(), state.session(),
                        releasable=not held() and st.session_state.get("saved_current", False))


def restore(lm: LoadedModel) -> None:
    """Replace this page's session by the autosave of its id, if there is one. A restore that is refused, fails or is
    stopped holds the autosave: nothing is written over it until the person chooses (see :func:`held`)."""
    path = autosave_path(st.session_state.sid)
    if not path.is_file():
        return
    st.session_state.held = ("restore", "The restore of the autosaved session was stopped. Its file is kept as it "
                             "was: nothing is saved over it.")
    try:
        text = path.read_bytes()
        session, draft, view = load(lm, text, "Restoring the autosaved session")
    except Exception as exc:  # noqa: BLE001 — refused (KvvizError), unreadable or failed: the file stays as it is
        st.session_state.held = ("restore", f"The autosaved session could not be restored ({exc}). Its file is kept "
                                 "as it was: nothing is saved over it.")
        return
    state.replace(session, draft, view, branch=state.branch(), branches=state.branches())  # released, then back
    st.session_state.revision, st.session_state.held = autosave.revision(text), None
    # what the file holds is saved already: a page that only restored it writes nothing (another tab's save stays)
    st.session_state.saved = json.dumps(document(), ensure_ascii=False)


def load(lm: LoadedModel, text: str | bytes, label: str) -> tuple[Session, EditDraft, dict]:
    """A session file's session, draft and view: checked in full, room made for it within the server's memory
    budget, then replayed with a progress bar (``label``); refusals raise :class:`KvvizError`."""
    checked = check_file(lm.geometry, text)  # checked once: the import does not check it again
    state.make_room(checked.tokens)
    with replay_progress(label) as progress:
        return import_session(lm, checked, progress)


def held() -> tuple[str, str] | None:
    """Why this page does not autosave now, or None: ``("restore", message)`` after a refused restore, ``("conflict",
    message)`` when another tab saved the same id since this page loaded or saved it."""
    return st.session_state.get("held")


def move_to_new_id() -> None:
    """Keep what this page holds under a new id (the other file is left as it is); autosaving resumes."""
    st.session_state.sid = st.query_params["s"] = uuid.uuid4().hex
    st.session_state.held, st.session_state.revision, st.session_state.saved = None, None, None


def autosave_path(sid: str) -> Path:
    """``$KVVIZ_SESSIONS/<id>.json`` (default: ``sessions/`` in kvviz's cache folder)."""
    folder = settings.text("KVVIZ_SESSIONS") or cache_root() / "sessions"
    return Path(folder) / f"{sid}.json"


def document() -> dict:
    """This browser session as an export document (conversation, edits, view)."""
    view = {key: st.session_state[key] for key in ("layer", "head", "at")} | {"prepared": state.prepared()}
    return export_session(state.session(), state.draft(), view)


def save() -> None:
    """End of the editor's run (a click's, or part of a page run): keep the export current and autosave it."""
    if state.session().released:  # its tensors (and commits) are gone: the next run of the page restores it
        return
    doc, was_held = document(), held()
    st.session_state.setdefault("export", {})["doc"] = doc  # read by the export button's deferred download
    st.session_state.saved_current = False
    try:
        _autosave(doc)
    except OSError as exc:  # a full or read-only disk must not take the page down (nor may the server release it)
        st.caption(plain(f"Autosave failed: {exc}"))
    if held() and not was_held:
        st.rerun(scope="app")  # the banner at the top says why and offers the way on


def export_json() -> Callable[[], str]:
    """The export document of the last run, for a deferred download (called outside any script run)."""
    holder = st.session_state.setdefault("export", {})
    return lambda: json.dumps(holder.get("doc", {}), ensure_ascii=False, indent=1)


def _autosave(doc: dict) -> None:
    """Write ``doc`` for this URL's id when it changed: atomically (a reload never reads half a file), owner-only
    (folder 0700, file 0600), and never over a file another tab wrote since this page read or wrote it — that holds
    autosaving instead (see :func:`held`), so neither tab's work is lost."""
    text = json.dumps(doc, ensure_ascii=False)
    ss = st.session_state
    if ss.get("saved") == text:
        ss.saved_current = True
        return
    if not ss.get("sid") or held():
        return
    try:
        revision = autosave.write(autosave_path(ss.sid), text, ss.get("revision"))
    except autosave.Conflict:
        ss.held = ("conflict", "This conversation was saved from another tab or window since this page loaded it. "
                   "This page stopped autosaving, so neither version is lost.")
        return
    ss.saved, ss.revision, ss.saved_at, ss.saved_current = text, revision, time.monotonic(), True


def save_every(seconds: float) -> None:
    """:func:`save` if the last autosave is older than ``seconds`` (a reply being written is saved as it grows)."""
    if time.monotonic() - st.session_state.get("saved_at", 0.0) >= seconds:
        save()


def new_conversation(lm: LoadedModel, sampling: Sampling | None = None) -> None:
    if held():  # the held file stays as it is: the new conversation gets its own id
        move_to_new_id()
    st.session_state.session = Session(lm, sampling)
    st.session_state.draft, st.session_state.at, st.session_state.prepared = EditDraft(), None, []
    st.session_state.branch, st.session_state.branches = "main", []
