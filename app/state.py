"""Per-browser-session state, all in ``st.session_state``: the Session, the draft edit and the view settings."""

from __future__ import annotations

import streamlit as st

from kvviz.draft import EditDraft
from kvviz.session import Sampling, Session

MEAN = -1  # the "head" setting that means the mean over query heads

DEFAULTS = {"layer": 0, "head": MEAN, "at": None, "max_new_tokens": 48, "large": False, "notice": None}


def init(lm) -> None:
    """Create what this browser session needs, once (``if key not in st.session_state``)."""
    if "session" not in st.session_state:
        st.session_state.session = Session(lm)
    if "draft" not in st.session_state:
        st.session_state.draft = EditDraft()
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)


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
