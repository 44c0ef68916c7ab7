"""Charts for slides: one self-contained HTML file (Vega's JavaScript inlined, so it opens offline on a projector
laptop)."""

from __future__ import annotations

import html

import altair as alt


def figures_html(charts: list[alt.TopLevelMixin], title: str) -> str:
    """An HTML page with ``charts`` one below the other (vl-convert inlines vega, vega-lite and vega-embed)."""
    page = alt.vconcat(*charts).resolve_scale(color="independent").to_html(inline=True)
    return page.replace("<body>", f"<body>\n<h2>{html.escape(title)}</h2>", 1)
