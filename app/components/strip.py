"""The cache strip as a Streamlit v2 component: one chip per cached slot; a click toggles eviction, a shift-click
selects. Python holds every bit of state (the draft edit); the component only draws and reports clicks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import streamlit as st

_HERE = Path(__file__).parent
_component = st.components.v2.component(
    "kvviz_strip", js=(_HERE / "strip.js").read_text(), css=(_HERE / "strip.css").read_text()
)


def token_strip(chips: list[list], at: int, on_click: Callable[[], None], large: bool = False, key: str = "strip"):
    """Mount the strip; ``on_click`` runs (as a callback) after a chip is clicked: read ``clicked(key)`` there."""
    return _component(data={"chips": chips, "at": at, "large": large}, key=key, on_click_change=on_click)


def clicked(key: str = "strip") -> dict | None:
    """The last click, ``{"slot", "shift"}``, inside the ``on_click`` callback."""
    state = st.session_state.get(key)
    value = getattr(state, "click", None) if state is not None else None
    if value is None and isinstance(state, dict):
        value = state.get("click")
    return value
