"""Attention: the layer × head overview of the current step, one head's full map, and the current row."""

from __future__ import annotations

import streamlit as st

from app import state
from app.views.token_strip import window_note
from kvviz import figures
from kvviz.view_data import attention_row, head_map, overview


def render() -> None:
    session, at = state.session(), state.step_slot()
    if len(session) == 0:
        st.info("Send a message to see attention.")
        return
    layer, head = st.session_state.layer, state.detail_head()
    st.plotly_chart(figures.overview_figure(overview(session, at), session.lm.kv_heads, at), key="overview")
    st.caption("Pick the layer and head above the strip to open that head's map.")
    windows = session.lm.attention.windows
    if any(w is not None for w in windows):
        local = [str(i) for i, w in enumerate(windows) if w is not None]
        st.caption(f"Sliding-window layers: {', '.join(local)} (window {', '.join(sorted({str(w) for w in windows if w}))}"
                   f" slots; they see only the most recent ones, the band along the map's diagonal) · the others see "
                   "every earlier slot.")
    note = window_note(session, at, layer)
    if note:
        st.caption(note)
    weights, block = head_map(session, layer, head)
    st.plotly_chart(figures.head_map_figure(weights, block, session.transcript.boundaries(), f"Layer {layer}, head {head}"),
                    key="headmap")
    slots = session.transcript.slots[: at + 1]
    row = attention_row(session, at, layer, head).tolist()
    st.plotly_chart(figures.row_figure(row, [s.text for s in slots], session.transcript.segments()[: at + 1],
                                       f"Slot {at} attends to (layer {layer}, head {head})"), key="row")

