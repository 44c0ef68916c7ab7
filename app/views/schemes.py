"""Quantization schemes side by side at the current step: each as the whole cache before the step, one what-if
each (kvviz.schemes.compare)."""

from __future__ import annotations

import streamlit as st

from app import state
from app.plain import warn
from kvviz.schemes.calibration import CALIBRATION_TEXT
from kvviz.errors import KvvizError
from kvviz.schemes.catalogue import schemes
from kvviz.schemes.compare import compare_schemes

OFFERED = ["fp16", "int8-token", "int4-token", "int4-channel", "int2-token", "int2-token+hadamard",
           "int2-token+outliers4", "int2-channel", "int2-channel+outliers4", "kivi-4", "kivi-2", "fp8-e4m3-head",
           "fp8-e4m3-tensor", "fp8-e5m2-head", "fp8-e5m2-tensor", "fp8-e4m3-head-static", "fp8-e4m3-tensor-static",
           "fp8-e5m2-tensor-static", "fp8-e4m3-unit", "fp8-e5m2-unit", "int2-channel+prerope", "int3-channel+prerope",
           "mix3-uniform", "mix3-keyerror", "mix2.5-keyerror", "quanto-4", "quanto-2", "nvfp4", "nvfp4-4over6", "mxfp4",
           "mxfp4-b16", "int8-token-head", "int4-token-head", "fp8-token-head", "k8v4-token-head", "k4v2-token-head",
           "nvfp4+skip-first2", "int4-token-head+skip-last2"]
DEFAULT = ["int4-token", "kivi-2", "fp8-e4m3-head", "fp8-e4m3-head-static", "int2-channel+prerope", "mix3-keyerror",
           "quanto-4"]  # one row of chips at 1500 px: a second row puts the menu a × opens over the button below
LATENT = ["fp16", "int8-token", "int4-token", "fp8-e4m3-head", "fp8-ds-mla"]  # a latent cache (MLA): its own format
HEADERS = {"scheme": "Scheme", "quantized": "Slots rounded", "kl": "KL (nats)", "tv": "TV", "top1": "Top-1 (full → scheme)", "bytes": "Cache bytes",
           "ratio": "× smaller than 16-bit", "nominal": "× nominal",
           "delta_o": "‖Δo‖", "weight_term": "Weight term", "content_term": "Content term",
           "saturated": "Clipped", "label": "What it stores"}


def render(session, at: int) -> None:
    """The expander under the edit tools: pick schemes, compare, one row each. The picker is a form: choosing or
    removing a scheme sends nothing until *Compare the schemes* (each × once reran the page's editor, ~2 s)."""
    with st.expander("Compare quantization schemes at this step (int, KIVI, FP8, NVFP4 / MXFP4, per-token-head, "
                     "transformers' QuantizedCache)"):
        with st.form("schemes-form", border=False):
            latent = session.lm.attention.latent is not None
            chosen = st.multiselect("Schemes", OFFERED + ["fp8-ds-mla"] if latent else OFFERED,
                                    LATENT if latent else DEFAULT, key="schemes_chosen",
                                    help="Each stores every slot before this step its way; kivi and quanto hold the "
                                         "cache as a KIVI run or transformers' QuantizedCache would at this step (their "
                                         "recent slots stay at full precision)")
            calibration = st.text_area("Calibration text (sets the static FP8 scales)", CALIBRATION_TEXT,
                                       key="calibration_text", height=80, help="read by the -static schemes only")
            compare = st.form_submit_button("Compare the schemes", disabled=at < 1)
        if compare:
            try:
                if not chosen:
                    raise KvvizError("choose at least one scheme to compare")
                rows = compare_schemes(session, schemes(chosen), at, calibration_text=calibration)
            except KvvizError as exc:
                warn(exc)
            else:
                state.keep("schemes", (session.version, at, rows))
        kept = state.kept("schemes")
        if not kept:
            return
        version, when, rows = kept
        if (version, when) != (session.version, at):
            st.caption(f"These rows are of step {when}" + (" before the cache changed" if version !=
                       session.version else "") + "; compare again for this one.")
        table = [{header: row.to_dict()[name] for name, header in HEADERS.items()} for row in rows]
        st.dataframe(table, hide_index=True, column_config={
            HEADERS["kl"]: st.column_config.NumberColumn(format="%.4g"),
            HEADERS["tv"]: st.column_config.NumberColumn(format="%.4g"),
            HEADERS["bytes"]: st.column_config.NumberColumn(format="%d"),
            HEADERS["ratio"]: st.column_config.NumberColumn(
                format="%.3g×",
                help="the 16-bit cache's bytes over this scheme's, every scale and zero point counted"),
            HEADERS["nominal"]: st.column_config.NumberColumn(
                format="%.3g×", help="16 over the bits per element the format's name promises (scales not counted)"),
            HEADERS["saturated"]: st.column_config.NumberColumn(
                format="%d", help="elements (keys and values) past a static FP8 scale's range, saturated"),
            **{HEADERS[k]: st.column_config.NumberColumn(format="%.4g") for k in ("delta_o", "weight_term",
                                                                                   "content_term")}})
        idle = [row.scheme for row in rows if row.quantized == 0 and row.scheme != "fp16"]
        if idle:
            st.caption(f"{', '.join(idle)} round{'s' if len(idle) == 1 else ''} nothing before this step: their "
                       "recent slots stay at full precision (KIVI's 128; QuantizedCache quantizes a prompt only after "
                       "its own pass, and then its residual of 128).")
        st.caption(f"Cache bytes as computed: {rows[0].full_bytes:,}. ‖Δo‖ = the isolated change of every layer's "
                   "attention output over its query heads; it splits exactly into the weight term (keys rounded move "
                   "the weights) and the content term (values rounded), as vectors.")
