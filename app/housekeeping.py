"""Memory of closed browser sessions comes back without slowing clicks.

Streamlit's per-session objects sit in reference cycles, so a dropped session (and the caches it holds) is freed only
by the cyclic garbage collector. Collecting after every run (Streamlit's ``runner.postScriptGC``) costs ~0.1 s of CPU
per click with torch, transformers and plotly loaded, so the shipped config turns it off; instead, one thread collects
every ``KVVIZ_GC_SECONDS`` (default 30) while no script has run for a few seconds — off the click path.
"""

from __future__ import annotations

import gc
import os
import threading
import time

IDLE_SECONDS = 3.0  # no script run started for this long: collecting now delays no click
_last_run = time.monotonic()
_started = threading.Event()


def touch() -> None:
    """Note that a script run started (called at the top of every page run)."""
    global _last_run
    _last_run = time.monotonic()


def collect_when_idle(period: float) -> None:
    """Forever: every ``period`` seconds, once the server has been idle for :data:`IDLE_SECONDS`, collect."""
    while True:
        time.sleep(period)
        while time.monotonic() - _last_run < IDLE_SECONDS:
            time.sleep(IDLE_SECONDS)
        gc.collect()


def start() -> None:
    """Start the collector thread once per server process (idempotent)."""
    if _started.is_set():
        return
    _started.set()
    period = float(os.environ.get("KVVIZ_GC_SECONDS", "30"))
    threading.Thread(target=collect_when_idle, args=(period,), name="kvviz-gc", daemon=True).start()
