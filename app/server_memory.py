"""One memory budget for every browser session on this server, and releasing the sessions nobody is using.

Each page run reports its kvviz session here (a weak reference: this registry keeps nothing alive) with the bytes it
holds (:meth:`kvviz.session.Session.nbytes`: cache, recorded queries, kept what-if runs, view memos) and those of
the results the page keeps beside it (``KEPT``: a policy run, a comparison, … — a kept policy run holds a
compressed session per turn and the full run's logits, ~2x the conversation's own session). Before a page
adds tokens it asks for room: derived data of other sessions goes first (it is recomputed on demand), then whole
sessions, least recently used first — their state is autosaved, so releasing frees their tensors (and drops the
results the page kept) and the page restores them by replay when its person comes back. A session that is running, or
whose autosave is held (a refused restore, another tab's save), is never released. If even that is not enough, the
turn is refused with one line.
Sessions whose browser is gone (Streamlit dropped the connection) or idle for ``KVVIZ_IDLE_MINUTES`` (15) are
released by the housekeeping thread. A page stays "seen connected" across the sessions it shows (a restore replaces
its session): a page that restored and closed within the sweep's 5 s was otherwise kept until the idle limit.

Budget: ``KVVIZ_SERVER_MEMORY_MB``, default half of the machine's memory (of the GPU's, on CUDA) at start.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from streamlit import runtime
from streamlit.runtime.app_session import AppSession
from streamlit.runtime.scriptrunner import get_script_run_ctx

from kvviz import settings
from kvviz.errors import KvvizError
from kvviz.memo import held_bytes
from kvviz.model import LoadedModel
from kvviz.session import Session

# a slot costs its K/V and query (LoadedModel.bytes_per_slot) plus spare room and the kept what-if runs: measured
# 1.7-2.4x of bytes_per_slot in all (40 to 1,000 slots, after one what-if)
HEADROOM = 2.5
# how deep the page's kept results are walked for tensors: a kept policy run's tensors lie 9 levels down (the run, its
# turns, a turn, its compressed session, its session, its cache, the layers, a layer, its keys)
KEPT_DEPTH = 16
# the results a page keeps in its session state beside its session: shown until replaced, recomputed, not saved
KEPT = ("toy", "comparison", "schemes", "policy_run", "policy_blame", "tour")

# What a page keeps beside its session, asked at the end of each of its runs (in the page's thread): the bytes, and a
# function that drops it (None where it cannot be dropped from outside the page's run)
Kept = Callable[[], tuple[int, Callable[[], None] | None]]


@dataclass
class Entry:
    session: weakref.ref
    bytes: int
    last_seen: float
    runs: int  # runs of the page under way (the page's and its fragment's)
    releasable: bool  # its autosave holds its current state
    connected: bool = False  # the page was seen connected by a sweep: only then can its browser be gone
    kept: int = 0  # bytes of the results the page keeps beside its session (counted in ``bytes``)
    drop_kept: Callable[[], None] | None = None  # drops them; None where they cannot be dropped


class ServerMemory:
    def __init__(self, budget: int, idle_seconds: float, kept: Kept | None = None):
        """``kept``: what the page whose run ends keeps beside its session (see :func:`page_kept`); None: nothing."""
        self.budget, self.idle_seconds, self.kept = budget, idle_seconds, kept
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        self.released = 0  # sessions released so far (for the load script and the page)

    def started(self, page: str, session: Session, whole_page: bool) -> bool:
        """A run of ``page`` began on ``session`` (``whole_page``: the page's own run, which ends any run before it;
        else a fragment's): it is in use until :meth:`finished`. Returns whether the session was released already
        (the page must restore it first)."""
        with self._lock:
            entry = self._entry(page, session, runs=0)
            entry.runs = 1 if whole_page else entry.runs + 1
            entry.last_seen, entry.releasable = time.monotonic(), False
            return session.released is not None

    def finished(self, page: str, session: Session, releasable: bool) -> None:
        """A run ended: note what the session and the page's kept results hold now, and whether its autosave holds
        it (only then may it be released); if the run took more than it asked for (a what-if's kept runs, a policy
        run's result), other sessions make up for it as in :meth:`make_room`."""
        held = session.nbytes()
        kept, drop = self.kept() if self.kept is not None else (0, None)
        with self._lock:
            entry = self._entry(page, session, runs=1)
            entry.runs, entry.bytes, entry.kept, entry.drop_kept = max(entry.runs - 1, 0), held + kept, kept, drop
            entry.last_seen, entry.releasable = time.monotonic(), releasable
            self._free(page, 0)

    def usage(self) -> int:
        """Bytes accounted to the sessions alive now."""
        with self._lock:
            return self._total()

    def make_room(self, page: str, tokens: int, bytes_per_slot: int) -> None:
        """Free memory of other sessions until ``tokens`` more slots fit the budget (with :data:`HEADROOM`): derived
        data first, then the least recently used releasable sessions. Refuses (:class:`KvvizError`) when that is not
        enough."""
        needed = int(tokens * bytes_per_slot * HEADROOM)
        with self._lock:
            if self._free(page, needed):
                if page in self._entries:  # reserved until the run that asked says what it holds
                    self._entries[page].bytes += needed
            else:
                raise KvvizError(f"the server's memory budget ({self.budget / 2**20:,.0f} MiB, KVVIZ_SERVER_MEMORY_MB) "
                                 f"is taken by sessions in use: this needs {needed / 2**20:,.0f} MiB more than fits; "
                                 "try again later or with a shorter message")

    def _free(self, page: str, needed: int) -> bool:
        """Derived data, then whole sessions, of pages other than ``page`` until ``needed`` more bytes fit."""
        others = sorted((e for p, e in self._entries.items() if p != page and self._idle(e)), key=lambda e: e.last_seen)
        for step in (self._drop_derived, self._release):
            for entry in others:
                if self._total() + needed <= self.budget:
                    return True
                step(entry, "to make room for another session within the server's memory budget")
        return self._total() + needed <= self.budget

    def sweep(self, is_connected: Callable[[str], bool | None]) -> int:
        """Release the sessions whose browser is gone (seen connected by an earlier sweep, not now) or that were idle
        for ``idle_seconds``; returns how many. ``is_connected`` is None where it cannot tell (no server, e.g. under
        AppTest): such a sweep leaves the page's connection as it was. A page never seen connected is only ever
        idle."""
        now, count = time.monotonic(), 0
        with self._lock:
            for page, entry in list(self._entries.items()):
                session = entry.session()
                if session is None:  # the page dropped it (Streamlit dropped the page, or it shows another session)
                    del self._entries[page]
                    continue
                connected = is_connected(page)
                gone = entry.connected and connected is False
                idle = now - entry.last_seen > self.idle_seconds
                entry.connected |= bool(connected)
                if (gone or idle) and self._idle(entry) and not session.released:
                    self._release(entry, "its browser closed" if gone else
                                  f"it was idle for more than {self.idle_seconds / 60:g} minutes")
                    count += 1
        return count

    def _idle(self, entry: Entry) -> bool:
        """No run under way and its autosave holds it (a run stopped midway leaves it in use until the next one)."""
        return entry.releasable and entry.runs == 0 and entry.session() is not None

    def _entry(self, page: str, session: Session, runs: int) -> Entry:
        """The entry of ``page`` for ``session``; a new one (with ``runs`` under way) for a page or session not seen.
        A page seen connected stays so when it shows another session (a restore, a new conversation)."""
        entry = self._entries.get(page)
        if entry is None or entry.session() is not session:
            connected = entry is not None and entry.connected
            entry = self._entries[page] = Entry(weakref.ref(session), 0, 0.0, runs, False, connected)
        return entry

    def _total(self) -> int:
        return sum(e.bytes for e in self._entries.values() if e.session() is not None)

    def _drop_derived(self, entry: Entry, why: str) -> None:
        session = entry.session()
        if session is not None and not session.released:
            freed = session.memo.nbytes()
            session.memo.clear()
            entry.bytes = max(entry.bytes - freed, 0)

    def _release(self, entry: Entry, why: str) -> None:
        """Free the session's tensors and drop the page's kept results (they stay counted where they cannot be)."""
        session = entry.session()
        if session is not None and not session.released:
            session.release(why)
            if entry.drop_kept is not None:
                entry.drop_kept()
                entry.kept, entry.drop_kept = 0, None
            entry.bytes = entry.kept
            self.released += 1


def default_budget(lm: LoadedModel) -> int:
    """``KVVIZ_SERVER_MEMORY_MB``, else half of the machine's memory (the GPU's on CUDA)."""
    return int(settings.number("KVVIZ_SERVER_MEMORY_MB", lm.memory_capacity() / 2**21) * 2**20)


def page_kept(lm: LoadedModel) -> Kept:
    """:data:`Kept` for the Streamlit page whose run is ending: the results of ``KEPT`` in its session
    state, walked for tensors and arrays (the shared model's are not counted), and a function that drops them from
    the page's state (holding it weakly: a page Streamlit dropped is not kept alive by it). Where no Streamlit server
    runs (AppTest's stand-in), they are counted and cannot be dropped."""
    shared = {id(lm), id(lm.model)} | {t.untyped_storage().data_ptr()
                                       for t in (*lm.model.parameters(), *lm.model.buffers())}

    def kept() -> tuple[int, Callable[[], None] | None]:
        context = get_script_run_ctx(suppress_warning=True)
        if context is None:
            return 0, None
        state = context.session_state.filtered_state  # a copy, read without the script's yield point
        held = held_bytes([state[key] for key in KEPT if key in state], set(shared), KEPT_DEPTH)
        app = runtime.get_instance().get_app_session(context.session_id) if runtime.exists() else None
        if not held or not isinstance(app, AppSession):
            return held, None
        page = weakref.ref(app)

        def drop() -> None:
            app = page()
            if app is not None:
                state = app.session_state
                for key in KEPT:
                    if key in state:
                        del state[key]
        return held, drop
    return kept


def create(lm: LoadedModel) -> ServerMemory:
    return ServerMemory(default_budget(lm), settings.number("KVVIZ_IDLE_MINUTES", 15) * 60, page_kept(lm))
