"""Long work asked for inside a fragment — a policy run from its form, a sweep's case opened again — runs in the
page's own run instead, where it can be stopped: Streamlit does not interrupt a fragment's run for a click (it queues
the click's rerun until the run ends), while a click during the page's run stops that run at its next update.

The view hands over the work and what to do with its result; the page's run draws the progress (passes done of how
many, the time left, Stop) below the views, keeps the result and reruns. Stopped or refused, nothing is kept: the page
keeps what it had."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import streamlit as st

from app import state
from app.progress import long_progress
from kvviz.errors import KvvizError


@dataclass(frozen=True)
class Work:
    label: str  # what the bar says is running
    run: Callable[[Callable[[int, int], None]], Any]  # the work, given a progress(done, total) callback
    done: Callable[[Any], None]  # what to do with its result (keep it, say where it went)


def hand_over(work: Work) -> None:
    """Run ``work`` in the page's run, now (from a fragment: the page reruns)."""
    state.hand_over(work)
    st.rerun(scope="app")


def run_pending() -> None:
    """The work handed over, if any (once: a stopped run is not started again)."""
    work = state.take_work()
    if work is None:
        return
    try:
        with long_progress(work.label, "forward passes", "stop-long-work") as progress:
            result = work.run(progress)
    except KvvizError as exc:
        state.notify(str(exc))
    except Exception as exc:  # noqa: BLE001 — a failure is one line; the page keeps what it had
        state.notify(f"{work.label} could not finish ({type(exc).__name__}: {exc}); the page is unchanged.")
    else:
        work.done(result)
    st.rerun()
