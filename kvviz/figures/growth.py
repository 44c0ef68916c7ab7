"""Cache growth: the length after every prefill and decode step, stacked by segment."""

from __future__ import annotations

import plotly.graph_objects as go

from kvviz.transcript import SEGMENTS, Transcript

SEGMENT_COLOURS = {"history": "#7f8c9a", "query": "#2f80ed", "generated": "#f2994a"}


def growth(transcript: Transcript) -> go.Figure:
    """Cache length after every forward pass, stacked by segment: a prefill jumps, a decode step adds one."""
    steps = [event.step for event in transcript.growth]
    data = [dict(type="bar", x=steps, y=[getattr(event, segment) for event in transcript.growth], name=segment,
                 marker_color=SEGMENT_COLOURS[segment],
                 customdata=[[event.kind, event.turn, event.added] for event in transcript.growth],
                 hovertemplate="step %{x}: %{customdata[0]} (turn %{customdata[1]}, +%{customdata[2]})"
                               "<br>" + segment + " %{y}<extra></extra>")
            for segment in SEGMENTS]
    layout = dict(barmode="stack", bargap=0.05, height=280, margin=dict(l=10, r=10, t=30, b=10),
                  xaxis_title="forward pass", yaxis_title="cached slots",
                  legend=dict(orientation="h", yanchor="bottom", y=1.02))
    return go.Figure(dict(data=data, layout=layout))  # one spec, validated once
