"""Progress of long work (a policy run, a replay, a demo): after a second, a bar with what is done of how much, an
estimate of the time left, and a Stop button.

Pressing Stop (or any widget) asks Streamlit for a new run; the work's next progress report then ends it (Streamlit
stops the script at its next element update), and what it was building is dropped: the page keeps what it had.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import streamlit as st

QUIET_SECONDS = 1.0  # work shorter than this shows nothing
EVERY_SECONDS = 0.2  # the bar moves at most this often


def remaining(elapsed: float, done: int, total: int) -> str:
    """The time left at the pace so far, in words: ``about 40 s left``, ``about 3 min left``."""
    if done <= 0:
        return "estimating the time left"
    left = elapsed / done * max(total - done, 0)
    return f"about {left:.0f} s left" if left < 90 else f"about {left / 60:.0f} min left"


@contextmanager
def long_progress(label: str, unit: str, key: str) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback that draws ``label: done of total unit · about … left`` and a Stop
    button (``key``) once the work has taken a second."""
    start, last = time.monotonic(), [0.0]
    bar, stop = st.empty(), st.empty()

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if now - start < QUIET_SECONDS or now - last[0] < EVERY_SECONDS:
            return
        if not last[0]:
            stop.button("Stop", key=key, help="Stop now; the page keeps what it had")
        last[0] = now
        bar.progress(min(done / max(total, 1), 1.0),
                     text=f"{label}: {done:,} of {total:,} {unit} · {remaining(now - start, done, total)}")

    try:
        yield report
    finally:
        bar.empty()
        stop.empty()


def replay_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """:func:`long_progress` for :func:`kvviz.session_file.import_session` (tokens replayed)."""
    return long_progress(label, "tokens", "stop-replay")
