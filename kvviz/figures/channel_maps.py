"""The cache by channel (kvviz.channels): a slot × channel magnitude map with the outlier channels marked, and each
key channel's rounding error under several quantizers."""

from __future__ import annotations

import plotly.graph_objects as go
import torch

from kvviz.channels import Channels
from kvviz.figures.slides import QUANTIZER_COLOURS
from kvviz.spelling import spell_slot

LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10))


def channel_map(magnitudes: torch.Tensor, texts: list[str], title: str, outliers: list[int]) -> go.Figure:
    """``magnitudes`` ``(n, D)``: slots top to bottom (their tokens on hover), channels left to right; the outlier
    channels are marked above the map."""
    n, dim = magnitudes.shape
    rows = [spell_slot(slot, text) for slot, text in enumerate(texts[:n])]
    heatmap = dict(type="heatmap", z=magnitudes.tolist(), x=list(range(dim)), y=rows, colorscale="Viridis",
                   colorbar=dict(title="|x|", thickness=10),
                   hovertemplate="slot %{y}<br>channel %{x}<br>|x| %{z:.3f}<extra></extra>")
    marks = dict(type="scatter", mode="markers", x=outliers, y=[rows[0]] * len(outliers),
                 marker=dict(symbol="triangle-down", size=10, color="#d62728"),
                 name="outlier channels", hovertemplate="outlier channel %{x}<extra></extra>", cliponaxis=False)
    layout = dict(LAYOUT, title=title, height=min(720, 160 + 6 * n), yaxis=dict(autorange="reversed", showticklabels=n <= 60),
                  xaxis=dict(title="channel"), showlegend=False)
    return go.Figure(dict(data=[heatmap, marks], layout=layout))


def channel_errors(view: Channels) -> go.Figure:
    """Per key channel: its largest magnitude (bars) and the RMS error each quantizer leaves there (lines)."""
    dim = len(view.key_peaks)
    channels = list(range(dim))
    colours = ["#b0b0b0" if c not in view.outliers else "#d62728" for c in channels]
    data = [dict(type="bar", x=channels, y=view.key_peaks.tolist(), marker=dict(color=colours), name="max |k|",
                 yaxis="y2", opacity=0.45, hovertemplate="channel %{x}<br>max |k| %{y:.3f}<extra></extra>")]
    for (name, error), colour in zip(view.errors.items(), QUANTIZER_COLOURS):  # one per quantizer (6 at 4 bits)
        data.append(dict(type="scatter", mode="lines", x=channels, y=error.tolist(), name=f"{view.bits}-bit {name}",
                         line=dict(color=colour),
                         hovertemplate=f"{name}<br>channel %{{x}}<br>RMS error %{{y:.4f}}<extra></extra>"))
    layout = dict(LAYOUT, title=f"Key error per channel at {view.bits} bits (layer {view.layer}, KV head "
                                f"{view.kv_head}; bars: max |k|, red: outliers)", height=380,
                  xaxis=dict(title="channel"), yaxis=dict(title="RMS error of k̂ − k"),
                  yaxis2=dict(title="max |k|", overlaying="y", side="right", showgrid=False),
                  legend=dict(orientation="h", y=-0.25))
    return go.Figure(dict(data=data, layout=layout))
