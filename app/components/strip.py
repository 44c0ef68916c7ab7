"""The cache strip as a Streamlit v2 component: one chip per cached slot; a click toggles eviction, a shift-click
selects. Python holds every bit of state (the draft edit); the component only draws (kvviz/figures/strip.js, the
strip's one front end, which the notebook widget and the offline page load too) and reports clicks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import streamlit as st

from kvviz.errors import KvvizError
from kvviz.figures.strip import front_end, strip_css

_component = st.components.v2.component(  # the one front end of the strip, with this host's lines (strip.js here)
    "kvviz_strip", js=front_end(Path(__file__).with_name("strip.js")), css=strip_css()
)


def token_strip(chips: list[list], at: int, on_click: Callable[[], None], large: bool = False, key: str = "strip",
                found: list[int] | None = None, focus: int | None = None, sink: dict | None = None):
    """Mount the strip; ``on_click`` runs (as a callback) after a chip is clicked: read ``clicked(key)`` there.
    ``found``: slots a search matched (highlighted; the strip scrolls to the first). ``focus``: a slot to scroll to
    when it changes (a tour step's subject), instead of the current step. ``sink``: a learned sink's share of the
    step's attention (``{"share", "layer", "head"}``, :func:`kvviz.view_data.sink_share`), drawn as a chip before
    slot 0. A minimap of the whole cache above the strip scrolls it."""
    # sent as one JSON byte string: a dict is serialised twice by Streamlit (once more to hash it for the element's
    # identity), which cost ~40 ms per click at 8k chips; bytes are hashed as they are
    payload = json.dumps({"chips": chips, "at": at, "large": large, "found": found or [], "focus": focus,
                          "sink": sink},
                         separators=(",", ":"),
                         ensure_ascii=False)
    return _component(data=payload.encode(), key=key, on_click_change=on_click)


def clicked(key: str = "strip") -> object:
    """The last click as the page sent it (``{"slot", "shift", "nonce"}``, or anything a tampered page sends), inside
    the ``on_click`` callback; check it with :func:`parse_click`."""
    state = st.session_state.get(key)
    value = getattr(state, "click", None) if state is not None else None
    if value is None and isinstance(state, dict):
        value = state.get("click")
    return value


def parse_click(value: object, slots: int) -> tuple[int, bool]:
    """``(slot, shift)`` of a click event; refuses (:class:`KvvizError`, one line) anything but a slot below
    ``slots`` and a boolean shift."""
    if not isinstance(value, dict):
        raise KvvizError("ignored a malformed click on the strip (not an object)")
    slot, shift = value.get("slot"), value.get("shift", False)
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < slots:
        raise KvvizError(f"ignored a click on the strip for slot {str(slot)[:20]!r}: "
                         f"the strip holds slots 0..{slots - 1}")
    if not isinstance(shift, bool):
        raise KvvizError("ignored a malformed click on the strip (shift is not true or false)")
    return slot, shift
