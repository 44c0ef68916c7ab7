"""What-if figures and tables: α / α′ bars, layer × head maps of ρ and ‖Δo‖, hidden-state deltas, top-k tables."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

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


LAYOUT = dict(margin=dict(l=10, r=10, t=50, b=10), template="plotly_white")


def alpha_figure(detail: Detail, texts: list[str], rho: float) -> go.Figure:
    """α (full cache), α′ = α/(1−ρ) (closed form) and the weights the edited run used; evicted slots marked."""
    slots = detail.slots
    evicted = [s for s, v in zip(slots, detail.alpha_renorm) if v is None]
    figure = go.Figure()
    for name, values, colour in (("α full", detail.alpha_full, "#7f8c9a"), ("α′ = α/(1−ρ)", detail.alpha_renorm, "#2f80ed"),
                                 ("α used by the edited run", detail.alpha_edited, "#f2994a")):
        figure.add_trace(go.Bar(x=slots, y=[0 if v is None else v for v in values], name=name, marker_color=colour,
                                customdata=texts, hovertemplate="slot %{x} %{customdata}<br>%{y:.4f}<extra>" + name + "</extra>"))
    if evicted:
        figure.add_trace(go.Scatter(x=evicted, y=[detail.alpha_full[s] for s in evicted], mode="markers", name="evicted",
                                    marker=dict(symbol="x", size=9, color="#eb5757")))
    figure.update_layout(title=f"Layer {detail.layer}, head {detail.head}: evicted mass ρ = {rho:.4f}", barmode="group",
                         height=320, xaxis_title="slot", yaxis_title="weight", legend_orientation="h", **LAYOUT)
    return figure


def head_grid_figure(heads: dict[str, list[list[float]]]) -> go.Figure:
    """Layer × query head maps: ρ, ‖Δo‖ isolated (full-cache query) and ‖Δo‖ propagated (the real edited run)."""
    names = [("rho", "evicted mass ρ"), ("delta_isolated", "‖Δo‖ isolated"), ("delta_propagated", "‖Δo‖ propagated")]
    figure = make_subplots(rows=1, cols=3, subplot_titles=[title for _, title in names], horizontal_spacing=0.06)
    top = max(max(map(max, heads["delta_isolated"])), max(map(max, heads["delta_propagated"])), 1e-12)
    for column, (key, title) in enumerate(names, start=1):
        figure.add_trace(go.Heatmap(z=heads[key], colorscale="Viridis", zmin=0, zmax=1 if key == "rho" else top,
                                    showscale=column != 2, colorbar=dict(x=0.295 if column == 1 else 1.0, thickness=8),
                                    hovertemplate="layer %{y}, head %{x}<br>" + title + " %{z:.4g}<extra></extra>"),
                         row=1, col=column)
    figure.update_yaxes(autorange="reversed", title_text="layer", col=1)
    figure.update_yaxes(autorange="reversed")
    figure.update_yaxes(showticklabels=False, col=2)
    figure.update_yaxes(showticklabels=False, col=3)
    figure.update_xaxes(title_text="query head", dtick=1)
    figure.update_layout(height=460, **LAYOUT)
    return figure


def hidden_figure(hidden_delta: list[float]) -> go.Figure:
    """‖h̃ − h‖ after the embeddings (0) and after each layer: how the edit propagates (§11)."""
    figure = go.Figure(go.Scatter(x=list(range(len(hidden_delta))), y=hidden_delta, mode="lines+markers",
                                  hovertemplate="after layer %{x}<br>‖Δh‖ %{y:.4g}<extra></extra>"))
    figure.update_layout(title="Hidden-state change by layer", height=260, xaxis_title="layer (0 = embeddings)",
                         yaxis_title="‖h̃ − h‖", **LAYOUT)
    return figure


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
