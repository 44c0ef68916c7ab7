"""Figures for slides: one self-contained HTML file (plotly.js inlined, so it opens offline on a projector laptop)."""

from __future__ import annotations

import html

import plotly.graph_objects as go


def figures_html(figures: list[go.Figure], title: str) -> str:
    """An HTML page with ``figures`` one below the other (white theme); the first one carries plotly.js."""
    parts = [go.Figure(figure).update_layout(template="plotly_white").to_html(full_html=False, include_plotlyjs=index == 0)
             for index, figure in enumerate(figures)]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body><h2>{html.escape(title)}</h2>{''.join(parts)}</body></html>")
