"""Channels: one KV head's keys and values by channel, before and after RoPE, the outlier key channels named per
layer, and the error each quantizer leaves per key channel (kvviz.channels)."""

from __future__ import annotations

import streamlit as st

from app import state
from app.plain import warn
from app.views.slide_download import slide_popover
from kvviz.channels import OUTLIER_FACTOR, channels, outliers_by_layer
from kvviz.errors import KvvizError
from kvviz.figures import plot_slides
from kvviz.figures.channel_maps import channel_errors, channel_map
from kvviz.figures.slides import PLOTLY_CONFIG


def render() -> None:
    session = state.session()
    if len(session) < 2:
        st.info("The channel view needs a few cached slots.")
        return
    lm, at = session.lm, state.step_slot()
    cols = st.columns(4)
    # no default value beside the key: tours set these through Session State (Streamlit warns of both)
    layer = cols[0].number_input("Layer", 0, lm.layers - 1, key="channels_layer")
    kv_head = cols[1].number_input("KV head", 0, lm.kv_heads - 1, key="channels_kv_head")
    bits = cols[2].selectbox("Bits for the error", [2, 3, 4, 8], key="channels_bits")
    kind = cols[3].radio("Map", ["keys", "values"], horizontal=True, key="channels_kind")
    try:
        view = session.memoized("channels", (int(layer), int(kv_head), at, int(bits)),
                                lambda: channels(session, int(layer), int(kv_head), at, int(bits)), keep=4)
    except KvvizError as exc:
        warn(exc)
        return
    texts = [slot.text for slot in session.transcript.slots[:at]]
    latent = lm.attention.latent is not None  # MLA: the keys are latents (no RoPE), the values the RoPE keys
    if kind == "keys":
        matrix, stage = (view.keys, "of the latent, which carries no RoPE" if latent else "after RoPE") \
            if view.keys_pre is None else (view.keys_pre, "before RoPE")
        if view.keys_pre is not None and st.toggle("Keys as cached (after RoPE)", key="channels_post"):
            matrix, stage = view.keys, "after RoPE, as cached"
        title = f"|k| {stage}: layer {view.layer}, KV head {view.kv_head}, slots 0–{at - 1}"
        marked = view.outliers
    else:
        matrix, marked = view.values, []
        title = (f"|r| of the RoPE key (held as the values): layer {view.layer}, slots 0–{at - 1}" if latent else
                 f"|v|: layer {view.layer}, KV head {view.kv_head}, slots 0–{at - 1}")
    st.plotly_chart(channel_map(matrix, texts, title, marked), key="channels_map", config=PLOTLY_CONFIG)
    caption = plot_slides.caption(lm.name, at, session.commits.edit_at(at))
    slide_popover("channels", lambda: plot_slides.channel_slide(matrix.numpy(), texts, marked, title, caption),
                  f"kvviz-channels-{view.layer}-{view.kv_head}-{kind}")
    named = ", ".join(map(str, view.outliers)) or "none"
    st.caption(f"Outlier key channels here: {named} (largest |k| at least {OUTLIER_FACTOR:g}× the median channel's). "
               "A per-token scale must stretch to reach them, so the other channels get few codes; a per-channel "
               "scale gives each its own range — why KIVI quantizes keys per channel.")
    st.plotly_chart(channel_errors(view), key="channels_errors", config=PLOTLY_CONFIG)
    slide_popover("channel-errors", lambda: plot_slides.channel_errors_slide(
        view.key_peaks.numpy(), {name: error.numpy() for name, error in view.errors.items()}, view.outliers,
        view.bits, f"Key error per channel at {view.bits} bits: layer {view.layer}, KV head {view.kv_head}", caption),
        f"kvviz-channel-errors-{view.layer}-{view.kv_head}-{view.bits}")
    with st.expander("Outlier key channels, every layer"):
        found = session.memoized("outliers", at, lambda: outliers_by_layer(session, at), keep=1)
        st.dataframe([{"layer": layer, **{f"KV head {h}": ", ".join(map(str, c)) or "—" for h, c in enumerate(row)}}
                      for layer, row in enumerate(found)], hide_index=True)
