"""Cache growth: length after every prefill and decode step, stacked by segment, and bytes now."""

from __future__ import annotations

import streamlit as st

from app import state
from app.plain import warn
from app.views.slide_download import slide_popover
from kvviz import figures
from kvviz.figures import plot_slides
from kvviz.figures.slides import PLOTLY_CONFIG
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.whatif.memory import step_memory


def render() -> None:
    session = state.session()
    if not session.transcript.growth:
        st.info("The cache is empty.")
        return
    st.plotly_chart(figures.growth(session.transcript), key="growth", config=PLOTLY_CONFIG)
    at = len(session) - 1
    slide_popover("growth", lambda: plot_slides.growth_slide(session.transcript, plot_slides.caption(
        session.lm.name, at, session.commits.edit_at(at))), f"kvviz-growth-{len(session)}")
    try:
        memory = step_memory(session, Edit(), len(session))  # the committed edits (the draft's bytes: the what-if)
    except KvvizError as exc:
        warn(exc)
        return
    cols = st.columns(3)
    cols[0].metric(f"Cache after the last step ({session.lm.device_label})", f"{memory.full_bytes:,} B",
                   help="K and V of every cached slot (the what-if counts the cache before its step)")
    cols[1].metric("At fp16", f"{memory.fp16_bytes:,} B")
    cols[2].metric("With committed edits, packed", f"{memory.edited_bytes:,} B")
    st.dataframe([{"segment": name, **values.to_dict()} for name, values in memory.segments.items()], hide_index=True)
