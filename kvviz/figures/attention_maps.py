"""Attention figures: the layer × head overview of one step, one head's full map, and the current row."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from kvviz.figures.growth import SEGMENT_COLOURS
from kvviz.figures.whatif_charts import POINT_LIMIT
from kvviz.spelling import spell_slot

# No template: the app draws with its own theme (and a template costs ~15 ms a figure); exports add one. Figures are
# one spec given to ``go.Figure`` at once (validated in one pass; see figures/whatif.py).
LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10))


def overview_figure(rows: np.ndarray, kv_heads: int, at: int, chosen: tuple[int, int] | None = None) -> go.Figure:
    """``rows`` ``(L, H, B)``: each head's attention row (max-pooled to B bins) as one tiled heatmap, query heads
    grouped by the KV head they share, with a gap column between groups; the ``chosen`` (layer, head) framed."""
    layers, heads, bins = rows.shape
    group = heads // kv_heads
    gap = np.full((layers, 2), np.nan)
    tiles, ticks, labels = [], [], []
    column = 0
    for head in range(heads):
        if head and head % group == 0:
            tiles.append(gap)
            column += gap.shape[1]
        tiles.append(rows[:, head])
        ticks.append(column + bins / 2)
        labels.append(f"h{head}<br>KV{head // group}")
        column += bins
    image = np.concatenate(tiles, axis=1)
    heatmap = dict(type="heatmap", z=image, colorscale="Viridis", zmin=0, zmax=float(np.nanmax(rows)) or 1,
                   hovertemplate="layer %{y}<br>weight %{z:.3f}<extra></extra>", colorbar=dict(title="α", thickness=10))
    # a heatmap cannot be selected: one invisible marker per (layer, head) tile makes a click one
    centres = np.array(ticks)
    targets = dict(type="scatter", mode="markers", x=np.tile(centres, layers), y=np.repeat(np.arange(layers), heads),
                   marker=dict(size=14, opacity=0), hoverinfo="none", showlegend=False)  # point i: layer i // H
    frame = []
    if chosen is not None:  # the head the other views show
        layer, head = chosen
        left = ticks[head] - bins / 2
        frame = [dict(type="rect", x0=left - 0.5, x1=left + bins - 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line=dict(color="#d62728", width=2))]
    layout = dict(title=f"Attention of slot {at}: every layer × query head (keys left → right, max-pooled)",
                  height=560, shapes=frame, xaxis=dict(tickvals=ticks, ticktext=labels, showgrid=False),
                  yaxis=dict(title="layer", autorange="reversed", dtick=2, showgrid=False), clickmode="event+select",
                  **LAYOUT)
    return go.Figure(dict(data=[heatmap, targets], layout=layout))


def head_map_figure(weights: np.ndarray, block: int, boundaries: list[tuple[int, str]], title: str,
                    texts: list[str] | None = None) -> go.Figure:
    """One head's causal map (queries down, keys across). ``block`` slots per pixel; ``boundaries`` are
    ``(slot, label)`` lines, e.g. where segments or turns start; ``texts``: each slot's token, named on hover."""
    n = weights.shape[0]
    axis = np.arange(n) * block
    masked = np.where(np.tril(np.ones_like(weights, dtype=bool)) | (block > 1), weights, np.nan)
    heatmap = dict(type="heatmap", z=masked, x=axis, y=axis, colorscale="OrRd", zmin=0,
                   hovertemplate="query %{y}<br>key %{x}<br>α %{z:.4f}<extra></extra>", colorbar=dict(title="α", thickness=10))
    axes = dict(xaxis=dict(title="key slot", range=[0, n * block]), yaxis=dict(title="query slot", range=[n * block, 0]))
    if texts is not None and block == 1:  # one slot a cell: its token on hover, categories that keep slot order
        names = [spell_slot(slot, texts[slot]) for slot in range(n)]
        heatmap |= dict(x=names, y=names)
        every = max(1, n // 12)
        ticks = dict(type="category", tickvals=names[::every], ticktext=[str(s) for s in axis[::every]])
        axes = dict(xaxis=dict(title="key slot", range=[-0.5, n - 0.5], **ticks),
                    yaxis=dict(title="query slot", range=[n - 0.5, -0.5], **ticks))
    line = dict(type="line", line=dict(color="#2f80ed", width=1, dash="dot"))
    shapes = [line | edge for slot, _ in boundaries
              for edge in (dict(x0=slot, x1=slot, y0=0, y1=n * block), dict(y0=slot, y1=slot, x0=0, x1=n * block))]
    labels = [dict(x=slot, y=0, text=label, showarrow=False, yshift=12, font=dict(size=10)) for slot, label in boundaries]
    suffix = f" (max over {block}×{block} blocks)" if block > 1 else ""
    layout = dict(title=title + suffix, height=520, shapes=shapes, annotations=labels, **axes, **LAYOUT)
    return go.Figure(dict(data=[heatmap], layout=layout))


def row_figure(row: list[float], texts: list[str], segments: list[str], title: str) -> go.Figure:
    """The current token's weights as bars over slots, coloured by segment. Above :data:`POINT_LIMIT` slots a bar is
    the maximum over a block of ``ceil(n / POINT_LIMIT)`` slots (as the what-if's α chart), coloured by the segment of
    the slot that holds it, and the title says so: a bar per slot at 8k slots made 16k nodes of the page."""
    values, n, block = np.asarray(row, dtype=float), len(row), max(1, -(-len(row) // POINT_LIMIT))
    colours = np.array([SEGMENT_COLOURS[s] for s in segments], dtype=object)
    if block == 1:
        x, labels = np.arange(n), np.array([f"slot {i} {t}" for i, t in enumerate(texts)], dtype=object)
    else:
        starts = np.arange(0, n, block)
        slots = starts + np.pad(values, (0, -n % block), constant_values=-np.inf).reshape(-1, block).argmax(1)
        x = starts + (block - 1) / 2  # the middle of the block
        labels = np.array([f"slots {a}–{min(a + block, n) - 1}, the most at slot {spell_slot(s, texts[s])}"
                           for a, s in zip(starts, slots)], dtype=object)
        values, colours = values[slots], colours[slots]
        title += f" (the maximum over each block of {block} slots)"
    bars = dict(type="bar", x=x, y=values, width=block, marker_color=colours,
                customdata=labels,  # arrays: plotly validates lists item by item
                hovertemplate="%{customdata}<br>α %{y:.4f}<extra></extra>")
    layout = dict(title=title, height=260, bargap=0, xaxis_title="slot", yaxis_title="α", **LAYOUT)
    return go.Figure(dict(data=[bars], layout=layout))
