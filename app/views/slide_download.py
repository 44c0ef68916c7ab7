"""A figure for a slide: PNG (1920 px or 2×) or SVG, light theme, captioned; rendered offline when the download
button is pressed (kvviz.figures.slides)."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from kvviz.figures.slides import to_png, to_svg

FORMATS = {"PNG, 1920 px": ("png", 1), "PNG, 3840 px (2×)": ("png", 2), "SVG": ("svg", None)}


def download(where, label: str, build: Callable[[], dict], stem: str, chosen: str, key: str | None = None) -> None:
    """A download button in ``where`` for the Vega-Lite spec ``build()`` as the format ``chosen`` (a key of
    :data:`FORMATS`); nothing is rendered until the button is pressed."""
    extension, scale = FORMATS[chosen]

    def figure_file() -> bytes | str:
        spec = build()
        return to_png(spec, scale) if extension == "png" else to_svg(spec)

    where.download_button(label, figure_file, file_name=f"{stem}.{extension}", on_click="ignore", key=key,
                          mime="image/png" if extension == "png" else "image/svg+xml")


def slide_popover(key: str, build: Callable[[], dict], stem: str) -> None:
    """A small "For a slide" menu under a chart: the format and the download."""
    with st.popover("For a slide", icon=":material/slideshow:"):
        chosen = st.radio("Format", list(FORMATS), key=f"{key}-slide-format")
        download(st, "Download the figure", build, stem, chosen, key=f"{key}-slide")
