"""What-if figures and tables: α / α′ bars, layer × head maps of ρ and ‖Δo‖, hidden-state deltas, top-k tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvviz.metrics import NextToken
from kvviz.whatif import Detail

def visible(text: str) -> str:
    """Whitespace made visible for tables: newline ↵, tab ⇥, space ␣ at the ends."""
    text = text.replace("\n", "↵").replace("\t", "⇥")
    stripped = text.strip(" ")
    if stripped != text:
        left, right = len(text) - len(text.lstrip(" ")), len(text) - len(text.rstrip(" "))
        text = "␣" * left + stripped + "␣" * right
    return text or "∅"


# No template: the app draws with its own theme (and a template costs ~15 ms a figure); exports add one. Each figure
# is one spec handed to ``go.Figure`` at once: validated in one pass (adding traces and updating the layout one by
# one cost 3-4x as much, ~20 ms a figure on a click's path).
LAYOUT = dict(margin=dict(l=10, r=10, t=50, b=10))


def axis(title: str | None, **settings) -> dict:
    """An axis whose margin grows to fit its labels (the page draws these figures without Streamlit's theme)."""
    return dict(title=title, automargin=True, **settings)
BAR_LIMIT = 256  # above this many slots α is drawn as step lines: thousands of SVG bars take seconds to redraw


def alpha_figure(detail: Detail, texts: list[str], rho: float) -> go.Figure:
    """α (full cache), α′ = α/(1−ρ) (closed form) and the weights the edited run used; evicted slots marked."""
    slots, custom = np.asarray(detail.slots), np.asarray(texts, dtype=object)  # arrays: plotly validates lists item by item
    evicted = [s for s, v in zip(detail.slots, detail.alpha_renorm) if v is None]
    data = []
    for name, values, colour in (("α full", detail.alpha_full, "#7f8c9a"), ("α′ = α/(1−ρ)", detail.alpha_renorm, "#2f80ed"),
                                 ("α used by the edited run", detail.alpha_edited, "#f2994a")):
        kind = (dict(type="bar", marker_color=colour) if len(slots) <= BAR_LIMIT else
                dict(type="scatter", mode="lines", line=dict(color=colour, width=1, shape="hvh")))
        data.append(kind | dict(x=slots, y=np.array([0 if v is None else v for v in values]), name=name,
                                customdata=custom, hovertemplate="slot %{x} %{customdata}<br>%{y:.4f}<extra>" + name
                                + "</extra>"))
    if evicted:
        data.append(dict(type="scatter", x=evicted, y=[detail.alpha_full[s] for s in evicted], mode="markers",
                         name="evicted", marker=dict(symbol="x", size=9, color="#eb5757")))
    layout = dict(title=f"Layer {detail.layer}, head {detail.head}: evicted mass ρ = {rho:.4f}", barmode="group",
                  height=320, xaxis=axis("slot"), yaxis=axis("weight"), legend_orientation="h", **LAYOUT)
    return go.Figure(dict(data=data, layout=layout))


def head_grid_figure(heads: dict[str, list[list[float]]]) -> go.Figure:
    """Layer × query head maps side by side: ρ, ‖Δo‖ isolated (full-cache query) and ‖Δo‖ propagated (the real
    edited run), the two ‖Δo‖ maps on one colour scale. (Axes laid out directly: ``make_subplots`` costs ~40 ms.)"""
    names = [("rho", "evicted mass ρ"), ("delta_isolated", "‖Δo‖ isolated"), ("delta_propagated", "‖Δo‖ propagated")]
    top = max(max(map(max, heads["delta_isolated"])), max(map(max, heads["delta_propagated"])), 1e-12)
    width, gap = 0.293, 0.06
    data, layout, titles = [], dict(height=460, **LAYOUT), []
    for index, (key, title) in enumerate(names):
        left, suffix = index * (width + gap), str(index + 1) if index else ""
        data.append(dict(type="heatmap", z=np.asarray(heads[key]), colorscale="Viridis", zmin=0,
                         zmax=1 if key == "rho" else top, xaxis="x" + suffix, yaxis="y" + suffix, showscale=index != 1,
                         colorbar=dict(x=left + width + 0.002 if index == 0 else 1.0, thickness=8),
                         hovertemplate="layer %{y}, head %{x}<br>" + title + " %{z:.4g}<extra></extra>"))
        layout["xaxis" + suffix] = axis("query head", domain=[left, left + width], anchor="y" + suffix, dtick=1)
        layout["yaxis" + suffix] = axis("layer" if index == 0 else None, anchor="x" + suffix, autorange="reversed",
                                        showticklabels=index == 0)
        titles.append(dict(text=title, x=left + width / 2, y=1.0, xref="paper", yref="paper", xanchor="center",
                           yanchor="bottom", showarrow=False))
    return go.Figure(dict(data=data, layout=layout | dict(annotations=titles)))


def hidden_figure(hidden_delta: list[float]) -> go.Figure:
    """‖h̃ − h‖ after the embeddings (0) and after each layer: how the edit propagates (§11)."""
    data = [dict(type="scatter", x=np.arange(len(hidden_delta)), y=np.asarray(hidden_delta), mode="lines+markers",
                 hovertemplate="after layer %{x}<br>‖Δh‖ %{y:.4g}<extra></extra>")]
    layout = dict(title="Hidden-state change by layer", height=260, xaxis=axis("layer (0 = embeddings)"),
                  yaxis=axis("‖h̃ − h‖"), **LAYOUT)
    return go.Figure(dict(data=data, layout=layout))


def topk_frame(next_token: NextToken, side: str) -> pd.DataFrame:
    """The top-k table of one side (``full`` or ``edited``) with the rank in the other and the logit change."""
    rows = next_token.full if side == "full" else next_token.edited
    return pd.DataFrame({
        "token": [visible(c.text) for c in rows],
        "p": [c.prob for c in rows],
        "rank": [c.rank + 1 for c in rows],
        "rank other": [c.rank_other + 1 for c in rows],
        "Δrank": [c.rank_other - c.rank for c in rows] if side == "full" else [c.rank - c.rank_other for c in rows],
        "Δlogit": [c.logit_delta for c in rows],
    })
