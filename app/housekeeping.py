"""The server's housekeeping, off the click path: sessions whose browser is gone or that sat idle are released (see
:mod:`app.server_memory`), and the memory of closed sessions is collected.

Streamlit's per-session objects sit in reference cycles, so a dropped session (and the caches it holds) is freed only
by the cyclic garbage collector. Collecting after every run (Streamlit's ``runner.postScriptGC``) costs ~0.1 s of CPU
per click with torch, transformers and plotly loaded, so the shipped config turns it off; instead, one thread sweeps
every few seconds and collects every ``KVVIZ_GC_SECONDS`` (default 30), or right after a release, while no script
has started for a few seconds. Streamlit's runtime is read only here (which page runs, which browsers are connected).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time

from streamlit import runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from app.server_memory import ServerMemory

from kvviz import settings

IDLE_SECONDS = 3.0  # no script run started for this long: collecting now delays no click
SWEEP_SECONDS = 5.0
_last_run = time.monotonic()
_started = threading.Event()
_memories: list[ServerMemory] = []  # one budget per loaded model


def touch() -> None:
    """Note that a script run started (called at the top of every page run)."""
    global _last_run
    _last_run = time.monotonic()


def page_id(sid: str) -> str:
    """The key of this run's page for :class:`ServerMemory`: Streamlit's id of its browser session, then the page's
    own session id ``sid`` (the ``?s=`` one; Streamlit's is the same for every page under AppTest)."""
    context = get_script_run_ctx(suppress_warning=True)
    return f"{context.session_id if context is not None else ''}/{sid}"


def is_connected(page: str) -> bool | None:
    """Whether the browser session of ``page`` (see :func:`page_id`) is still connected (Streamlit keeps a closed
    one for a while); None where no Streamlit server can tell: none runs, or a stand-in does (AppTest puts a mock
    runtime in place during each script run and removes it after, which read as a browser connecting and closing)."""
    if not runtime.exists():
        return None
    active = runtime.get_instance().is_active_session(page.split("/", 1)[0])
    return active if isinstance(active, bool) else None


def housekeeping(period: float) -> None:
    """Forever: release what :meth:`ServerMemory.sweep` finds in every registered budget; collect after a release
    or every ``period`` s. A failing pass is logged and the next one runs (the thread must not die)."""
    collected = time.monotonic()
    while True:
        time.sleep(SWEEP_SECONDS)
        try:
            released = sum(memory.sweep(is_connected) for memory in list(_memories))
            if not released and time.monotonic() - collected < period:
                continue
            while time.monotonic() - _last_run < IDLE_SECONDS:
                time.sleep(IDLE_SECONDS)
            gc.collect()
            _trim()
            collected = time.monotonic()
        except Exception:  # noqa: BLE001
            logging.getLogger(__name__).exception("kvviz housekeeping pass failed")


def _trim() -> None:
    """Hand freed heap memory back to the system (glibc's ``malloc_trim``; elsewhere nothing): without it the RSS of
    a server whose sessions closed stayed ~640 MB above idle (the next sessions reused it)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def start(memory: ServerMemory) -> None:
    """Keep ``memory`` swept; the thread starts once per server process."""
    period = settings.number("KVVIZ_GC_SECONDS", 30)  # before anything changes: a bad value leaves no thread half-made
    _memories.append(memory)
    if _started.is_set():
        return
    _started.set()
    threading.Thread(target=housekeeping, args=(period,), name="kvviz-housekeeping", daemon=True).start()
