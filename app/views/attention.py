"""Attention: the layer × head overview of the current step, one head's full map, and the current row."""

from __future__ import annotations

import streamlit as st

from app import state
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
    weights, block = head_map(session, layer, head)
    st.plotly_chart(figures.head_map_figure(weights, block, session.transcript.boundaries(), f"Layer {layer}, head {head}"),
                    key="headmap")
    slots = session.transcript.slots[: at + 1]
    row = attention_row(session, at, layer, head).tolist()
    st.plotly_chart(figures.row_figure(row, [s.text for s in slots], session.transcript.segments()[: at + 1],
                                       f"Slot {at} attends to (layer {layer}, head {head})"), key="row")

