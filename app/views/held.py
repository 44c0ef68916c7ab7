"""Why this page is not autosaving (a refused restore, or another tab's save of the same id), and the way on."""

from __future__ import annotations

import streamlit as st

from app import persistence, state
from app.plain import warn


def render() -> None:
    held = persistence.held()
    if held is None:
        return
    kind, message = held
    warn(message)
    session = state.session()
    retry, new_id = st.columns(2)
    if kind == "restore":
        if retry.button("Try the restore again"):
            persistence.restore(session.lm)
            st.rerun()
        label = "Start a new conversation under a new id"
    else:
        if retry.button("Load the other tab's version"):
            persistence.restore(session.lm)
            st.rerun()
        label = "Keep this page's version under a new id"
    if new_id.button(label):
        persistence.move_to_new_id()
        st.rerun()
