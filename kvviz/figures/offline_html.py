"""Charts for slides: one self-contained HTML file (Vega's JavaScript inlined, so it opens offline on a projector
laptop)."""

from __future__ import annotations

import html

import vl_convert

from kvviz.figures.whatif_charts import Chart


def figures_html(charts: list[Chart], title: str) -> str:
    """An HTML page with ``charts`` one below the other (vl-convert bundles vega, vega-lite and vega-embed)."""
    spec = {"vconcat": [c.to_dict() for c in charts], "resolve": {"scale": {"color": "independent"}}}
    head, body, rest = vl_convert.vegalite_to_html(spec, bundle=True).rpartition("<body>")  # the last: the inlined
    return f"{head}{body}\n<h2>{html.escape(title)}</h2>{rest}"  # JavaScript in the head has "<body>" in its strings
