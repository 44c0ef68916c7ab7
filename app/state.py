"""Per-browser-session state, all in ``st.session_state``: the Session, the draft edit and the view settings."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import streamlit as st

from app import autosave, housekeeping
from app.plain import plain
from app.progress import replay_progress
from app.server_memory import KEPT, ServerMemory
from kvviz.edit.draft import EditDraft
from kvviz.model import LoadedModel, cache_root
from kvviz.sampling import Sampling
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.session_schema import parse, token_count, validate

SESSION_ID = re.compile(r"[0-9a-f]{32}")  # the ?s= URL parameter (full match); nothing else names an autosave file

MEAN = -1  # the "head" setting that means the mean over query heads

DEFAULTS = {"layer": 0, "head": MEAN, "at": None, "max_new_tokens": 48, "large": False, "notice": None,
            # the editor's settings, read before its widgets are drawn (see app/main.py's editor)
            "key_axis": "channel", "value_axis": "token", "group": 0, "symmetric": False, "number_format": "int", "fp8_scales": "dynamic", "pre_rope": False,
            "pick_k": 4, "pick_v": 4, "topk": 10, "continuation": 0, "raw_special_tokens": False}


def init(lm: LoadedModel, memory: ServerMemory) -> None:
    """Create what this browser session needs, once (``if key not in st.session_state``); after a page reload the
    autosaved session of this URL's ``?s=`` id is restored, and so is a session the server released meanwhile."""
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)
    st.session_state.server_memory = memory
    if "session" in st.session_state:
        released = session().released
        if released:
            # a fresh session first: a restore that is refused or stopped leaves a page that works (and holds the file)
            st.session_state.session, st.session_state.draft = Session(lm), EditDraft()
            restore(lm)
            if not held():
                notify(f"This conversation was set aside to free the server's memory ({released}) and has been "
                       "restored from its autosave.")
        begin_run(whole_page=True)
        return
    sid = st.query_params.get("s", "")
    if not SESSION_ID.fullmatch(sid):
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
            or memory is not None and memory.started(_page(), session(), whole_page)):
        st.rerun(scope="app")


def end_run() -> None:
    """The run of the page (or of its fragment) is over: the server may release the session if its autosave holds
    it."""
    memory = st.session_state.get("server_memory")
    if memory is not None:
        memory.finished(_page(), session(), releasable=not held() and st.session_state.get("saved_current", False))


def _page() -> str:
    return housekeeping.page_id(st.session_state.get("sid", ""))


def make_room(tokens: int) -> None:
    """Ask the server's memory budget for ``tokens`` more slots of this page's session (other sessions' derived data,
    then idle sessions, are released for it); refuses with :class:`KvvizError` when it cannot."""
    memory = st.session_state.get("server_memory")
    if memory is not None:
        memory.make_room(_page(), tokens, session().lm.bytes_per_slot)


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
    replace(session, draft, view)
    st.session_state.revision, st.session_state.held = autosave.revision(text), None
    # what the file holds is saved already: a page that only restored it writes nothing (another tab's save stays)
    st.session_state.saved = json.dumps(document(), ensure_ascii=False)


def load(lm: LoadedModel, text: str | bytes, label: str) -> tuple[Session, EditDraft, dict]:
    """A session file's session, draft and view: checked in full, room made for it within the server's memory
    budget, then replayed with a progress bar (``label``); refusals raise :class:`KvvizError`."""
    document = parse(text)
    validate(lm.geometry, document)
    make_room(token_count(document))
    with replay_progress(label) as progress:
        return import_session(lm, document, progress)


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
    folder = os.environ.get("KVVIZ_SESSIONS") or cache_root() / "sessions"
    return Path(folder) / f"{sid}.json"


def document() -> dict:
    """This browser session as an export document (conversation, edits, view)."""
    view = {key: st.session_state[key] for key in ("layer", "head", "at")} | {"prepared": prepared()}
    return export_session(session(), draft(), view)


def save() -> None:
    """End of the editor's run (a click's, or part of a page run): keep the export current and autosave it."""
    if session().released:  # its tensors (and commits) are gone: the next run of the page restores it
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


def session() -> Session:
    return st.session_state.session


def draft() -> EditDraft:
    return st.session_state.draft


def new_conversation(lm: LoadedModel, sampling: Sampling | None = None) -> None:
    if held():  # the held file stays as it is: the new conversation gets its own id
        move_to_new_id()
    st.session_state.session = Session(lm, sampling)
    st.session_state.draft, st.session_state.at, st.session_state.prepared = EditDraft(), None, []


def replace(session: Session, draft: EditDraft, view: dict | None = None, at: int | None = None) -> None:
    """Show another session (imported, restored or a demo's) with its draft; ``view`` settings (layer, head, step)
    where given, else the step ``at``."""
    st.session_state.session, st.session_state.draft, st.session_state.at = session, draft, at
    st.session_state.update({k: v for k, v in (view or {}).items() if k in ("layer", "head", "at")})
    st.session_state.prepared = list((view or {}).get("prepared", []))


def prepared() -> list[dict]:
    """The edits kept for the standalone page (``{"at", "edit", "label"}`` as a session file holds them)."""
    return st.session_state.setdefault("prepared", [])


def travel(at: int | None) -> None:
    """Show the step of slot ``at`` (None: always the newest)."""
    st.session_state.at = at


def choose_model(path: str | None) -> None:
    """Load the model at ``path`` on the next run (None: back to the default); this page's session starts anew."""
    if path is None:
        st.session_state.pop("model_path", None)
        return
    st.session_state.model_path = path
    for key in ("session", "draft"):
        st.session_state.pop(key, None)


def model_path() -> str | None:
    return st.session_state.get("model_path")


def keep(name: str, value) -> None:
    """Keep a result of :data:`KEPT` to show until the next one (a toy example and its cases, the last policy
    comparison, policy run or blame); None drops it."""
    if name not in KEPT:
        raise KeyError(name)
    st.session_state[name] = value


def kept(name: str):
    """The result kept under ``name`` (see :func:`keep`), or None."""
    return st.session_state.get(name)


def keep_policy_run(result, blame=None) -> None:
    """A new policy run drops the blame of the previous one."""
    keep("policy_run", result)
    keep("policy_blame", blame)


def upload_key() -> str:
    """The import uploader's key: a new one after each load, so a refused or stale file never stays behind."""
    return f"import_file_{st.session_state.get('uploads', 0)}"


def clear_upload() -> None:
    st.session_state.uploads = st.session_state.get("uploads", 0) + 1


def take_notice() -> tuple[str, bool] | None:
    """The message noted for this run and whether it is a plain note rather than a warning (see :func:`notify`),
    once."""
    notice, st.session_state.notice = st.session_state.notice, None
    return notice


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


def notify(message: str, note: bool = False) -> None:
    """A message shown once at the top of the next run: a warning (e.g. a refused click, reported from a callback), or
    with ``note`` a plain note (what a demo shows, where a result went)."""
    st.session_state.notice = (message, note)
