"""Attention: the layer × head overview of the current step, one head's full map, and the current row."""

from __future__ import annotations

import streamlit as st

from app import state
from app.views.slide_download import slide_popover
from app.views.token_strip import window_note
from kvviz import figures, recurrent
from kvviz.figures import plot_slides
from kvviz.figures.slides import PLOTLY_CONFIG
from kvviz.view_data import attention_row, head_map, overview

SLIDE_MAP = 160  # a head's map on a slide: at most 160 × 160 cells (a 25,600-cell SVG)


def _pick_cell() -> None:
    """A click on the overview: the layer and query head of that tile become the views' own."""
    points = st.session_state["overview"].selection.get("points") or []
    lm = state.session().lm
    index = points[0].get("point_index") if points and points[0].get("curve_number") == 1 else None
    if isinstance(index, int) and 0 <= index < lm.layers * lm.heads:  # the tile markers: layer-major
        state.choose_head(*divmod(index, lm.heads))  # the strip, the what-if and the pickers show them too


def render() -> None:
    session, at = state.session(), state.step_slot()
    if len(session) == 0:
        st.info("Send a message to see attention.")
        return
    layer, head = st.session_state.layer, state.detail_head()
    lm, caption = session.lm, plot_slides.caption(session.lm.name, at, session.commits.edit_at(at))
    st.plotly_chart(figures.overview_figure(overview(session, at), lm.kv_heads, at, (layer, head)), key="overview",
                    config=PLOTLY_CONFIG, on_select=_pick_cell, selection_mode="points")
    mean = " (the Head picker's mean of heads colours the strip; the maps show one head)" if state.head() is None else ""
    st.caption(f"Click a head in a layer row to open its map (or pick them above the strip) · shown: layer {layer}, "
               f"head {head}, framed in red{mean}")
    slide_popover("overview", lambda: plot_slides.overview_slide(overview(session, at), lm.kv_heads, at, caption),
                  f"kvviz-overview-slot{at}")
    linear = recurrent.linear_layers(lm.config)
    if linear:
        kv = recurrent.kv_layers(lm.config)
        rows = ", ".join(f"{row} = decoder layer {index}" for row, index in enumerate(kv))
        st.caption(f"Rows are the layers with a KV cache ({rows}); decoder layer{'s' * (len(linear) > 1)} "
                   f"{', '.join(map(str, linear))} keep a recurrent state and have no attention weights to show.")
    windows = session.lm.attention.windows
    if any(w is not None for w in windows):
        local = [str(i) for i, w in enumerate(windows) if w is not None]
        st.caption(f"Sliding-window layers: {', '.join(local)} (window {', '.join(sorted({str(w) for w in windows if w}))}"
                   f" slots; they see only the most recent ones, the band along the map's diagonal) · the others see "
                   "every earlier slot.")
    note = window_note(session, at, layer)
    if note:
        st.caption(note)
    weights, block = head_map(session, layer, head, stop=at + 1)  # looking back: no row of a later step
    texts = [s.text for s in session.transcript.slots[: at + 1]]
    boundaries = [(slot, label) for slot, label in session.transcript.boundaries() if slot <= at]
    title = f"Layer {layer}, head {head}" + (f", up to step {at}" if at < len(session) - 1 else "")
    st.plotly_chart(figures.head_map_figure(weights, block, boundaries, title, texts), key="headmap",
                    config=PLOTLY_CONFIG)
    slide_popover("headmap", lambda title=title: plot_slides.head_map_slide(
        *head_map(session, layer, head, SLIDE_MAP, stop=at + 1), boundaries, title, caption, texts),
        f"kvviz-map-l{layer}h{head}")
    segments = session.transcript.segments()[: at + 1]
    row, title = attention_row(session, at, layer, head).tolist(), f"Slot {at} attends to (layer {layer}, head {head})"
    st.plotly_chart(figures.row_figure(row, texts, segments, title), key="row", config=PLOTLY_CONFIG)
    slide_popover("row", lambda: plot_slides.row_slide(row, texts, segments, title, caption),
                  f"kvviz-row-slot{at}-l{layer}h{head}")

