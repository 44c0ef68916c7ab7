"""Progress of a long replay (a restore or an import): after a second, a bar and a Stop button.

Pressing Stop (or any widget) asks Streamlit for a new run; the replay's next progress report then ends it (Streamlit
stops the script at its next element update), and the session being rebuilt is dropped: the page keeps what it had.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import streamlit as st

QUIET_SECONDS = 1.0  # a replay shorter than this shows nothing
EVERY_SECONDS = 0.2  # the bar moves at most this often


@contextmanager
def replay_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback for :func:`kvviz.session_file.import_session`."""
    start, last = time.monotonic(), [0.0]
    bar, stop = st.empty(), st.empty()

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if now - start < QUIET_SECONDS or now - last[0] < EVERY_SECONDS:
            return
        if not last[0]:
            stop.button("Stop", key="stop-replay", help="Stop replaying; the page keeps what it had")
        last[0] = now
        bar.progress(min(done / max(total, 1), 1.0), text=f"{label}: {done:,} of {total:,} tokens")

    try:
        yield report
    finally:
        bar.empty()
        stop.empty()
