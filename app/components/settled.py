"""The page's settled flag: every run of the page, and of each of its fragments, ends by mounting this component,
which sets ``data-kv-runs`` on the document to the number of runs this browser session has finished. The browser
tests (tests/support/browser_page.py) note the number, act, and wait until it has grown and
Streamlit reports no script running: a state the page exposes, where a pause would be too short on a loaded machine
(a click's rerun can start seconds after the click) and too long on an idle one."""

from __future__ import annotations

import streamlit as st

from app import state

_JS = """export default function ({ data }) {
  const root = document.documentElement;  // runs only grow: an older mount drawn late does not take the count back
  if (Number(root.dataset.kvRuns || 0) < data.runs) root.dataset.kvRuns = String(data.runs);
}"""
_component = st.components.v2.component("kvviz_settled", js=_JS)
PLACES = ("editor", "views", "page")  # the two fragments and the page, each mounting its own


def settled(place: str) -> None:
    """The run of ``place`` (:data:`PLACES`) is over: count it and tell the browser. Its element takes no room (the
    style :func:`hide` sets)."""
    _component(data={"runs": state.finish_run()}, key=f"kv-settled-{place}", height=0)


def hide() -> None:
    """The flags' elements out of the layout (a style alone: Streamlit draws it outside the page's blocks)."""
    st.html("<style>" + ", ".join(f".st-key-kv-settled-{place}" for place in PLACES) + " {display: none;}</style>")
