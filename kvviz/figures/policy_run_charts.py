"""Figures of a policy run: per-step KL and top-1 agreement, the cache size over steps, and the eviction timeline."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch

from kvviz.figures.growth import SEGMENT_COLOURS
from kvviz.numbers import ordinal
from kvviz.runs.policy_run import PolicyRun
from kvviz.runs.timeline import NEVER
from kvviz.spelling import spell_slot

_LAYOUT = dict(height=280, margin=dict(l=10, r=10, t=40, b=10),
               legend=dict(orientation="h", yanchor="bottom", y=1.02))  # above the plot: below, it hid the ticks


STEP_TITLE = "step (−1: the prompt's last token, which chose the first reply token)"  # the charts' and the slides'
STEP_AXIS = dict(title=STEP_TITLE, tickformat="d", zeroline=False)


def kl_steps(result: PolicyRun, turn: int = -1) -> go.Figure:
    """KL(full ‖ policy) per step (teacher-forced; step -1 is the prefill's last row, which chose the first token),
    steps where the top-1 differs marked."""
    run = result.turns[turn]
    steps = [s.step for s in run.records]
    kl = [s.kl for s in run.records]
    flips = [s for s in run.records if not s.top1_agree]
    data = [dict(type="scatter", mode="lines+markers", x=steps, y=kl, name="KL(full ‖ policy)",
                 hovertemplate="step %{x}: KL %{y:.4f}<extra></extra>"),
            dict(type="scatter", mode="markers", x=[s.step for s in flips], y=[s.kl for s in flips],
                 name="top-1 differs", marker=dict(color="#d62728", size=11, symbol="x"),
                 hovertemplate="step %{x}: top-1 differs<extra></extra>")]
    if run.divergence is not None:
        data.append(dict(type="scatter", mode="lines", x=[run.divergence] * 2, y=[0, max(kl)],
                         name="divergence", line=dict(dash="dot", color="#d62728")))
    return go.Figure(dict(data=data, layout=dict(**_LAYOUT, xaxis=STEP_AXIS, yaxis_title="nats")))


def cache_size(result: PolicyRun, turn: int = -1) -> go.Figure:
    """Slots each step sees: the policy's by segment (mean over layers and KV heads), the full cache's, the budget
    (steps -1, 0, …)."""
    run = result.turns[turn]
    steps = [s.step for s in run.records]
    data = [dict(type="bar", x=steps, y=[s.by_segment[name] for s in run.records], name=f"policy: {name}",
                 marker_color=colour) for name, colour in SEGMENT_COLOURS.items()]
    data.append(dict(type="scatter", mode="lines", x=steps, y=[s.slot for s in run.records], name="full cache",
                     line=dict(color="#222")))
    budget = result.settings.budget
    if isinstance(budget, int):
        data.append(dict(type="scatter", mode="lines", x=steps, y=[budget] * len(steps), name="budget",
                         line=dict(dash="dash", color="#d62728")))
    layout = dict(**_LAYOUT, barmode="stack", bargap=0.05, xaxis=STEP_AXIS, yaxis_title="slots seen")
    return go.Figure(dict(data=data, layout=layout))


def seen_grid(result: PolicyRun, turn: int = -1, layer: int | None = None,
              kv_head: int | None = None) -> tuple[np.ndarray, int]:
    """``(n, steps)``: the share of layers and KV heads (or, for one ``layer`` / ``kv_head``, whether it does) that
    still see each slot at each decode step, NaN where the slot is not cached yet; and how many slots are evicted
    somewhere."""
    run = result.turns[turn]
    evicted = result.eviction_steps(turn)  # (L, KV, n): the step from which each slot is hidden
    if layer is not None:
        evicted = evicted[layer : layer + 1]
    if kv_head is not None:
        evicted = evicted[:, kv_head : kv_head + 1]
    steps = torch.arange(len(run.steps))
    n = evicted.shape[-1]
    seen = (evicted[..., None] > steps).float().mean((0, 1))  # (n, steps)
    seen[torch.arange(n)[:, None] >= run.prompt_end + steps] = float("nan")  # not cached yet
    return seen.numpy(), int((evicted < NEVER).any(0).any(0).sum())


def why_row(result: PolicyRun, turn: int, layer: int, kv_head: int, n: int) -> list[str]:
    """Per slot, why it left ``layer`` / ``kv_head`` during ``turn`` (the step, its score, the lowest kept score),
    that it left in an earlier turn, or that it stayed."""
    run = result.turns[turn]
    before = (result.eviction_steps(turn)[layer, kv_head] == -1).tolist()
    text = ["evicted in an earlier turn" if gone else "kept to the end of the turn" for gone in before[:n]]
    for slot, (at, why) in run.forced.reasons.of_head(layer, kv_head, run.prompt_end, run.end).items():
        text[slot] = (f"evicted before step {at - run.prompt_end}: score {why.score:.4g} < lowest kept "
                      f"{why.threshold:.4g} (rank {why.rank} of {why.candidates}, budget {why.budget})"
                      if why.score < why.threshold else f"evicted before step {at - run.prompt_end}: {why.reason}")
    return text


def bits_grid(result: PolicyRun, turn: int = -1) -> np.ndarray:
    """``(n, steps)``: the key bit-width each slot is stored at as each decode step sees it, NaN where not cached."""
    run, (key_bits, _) = result.turns[turn], result.settings.cache_format.window_bits
    steps = torch.arange(len(run.steps))
    quantized = result.quantized_steps(turn)  # (n,)
    n = quantized.shape[0]
    bits = torch.where(quantized[:, None] <= steps, float(key_bits), 16.0)
    bits[torch.arange(n)[:, None] >= run.prompt_end + steps] = float("nan")
    return bits.numpy()


def timeline(result: PolicyRun, pieces: list[str], turn: int = -1, layer: int | None = None,
             kv_head: int | None = None) -> go.Figure:
    """Slot × step: the share of layers and KV heads that still see each slot at each decode step (or, for one
    ``layer`` / ``kv_head``, whether it does); a slot's token text on hover."""
    seen, gone = seen_grid(result, turn, layer, kv_head)
    n = seen.shape[0]
    labels = [spell_slot(slot, pieces[slot]) for slot in range(n)]  # unique: a hover names the slot and its text
    data = [dict(type="heatmap", z=seen, x=np.arange(seen.shape[1]), y=labels, zmin=0, zmax=1,
                 colorscale=[[0, "#f4f4f4"], [1, "#2f80ed"]], colorbar=dict(title="seen"),
                 hovertemplate="step %{x} · slot %{y}<br>seen by %{z:.0%}<extra></extra>")]
    if layer is not None and kv_head is not None and result.settings.policy is not None:  # why each slot went
        reasons = why_row(result, turn, layer, kv_head, n)
        data[0]["customdata"] = [[reason] * seen.shape[1] for reason in reasons]
        data[0]["hovertemplate"] = "step %{x} · slot %{y}<br>seen: %{z:.0%}<br>%{customdata}<extra></extra>"
    height = grid_height(n)
    layout = dict(height=height, margin=dict(l=10, r=10, t=30, b=10), xaxis_title="decode step",
                  yaxis=slot_axis(labels, height), title=plain_title(timeline_title(gone, layer, kv_head)))
    return go.Figure(dict(data=data, layout=layout))


def bit_widths(result: PolicyRun, pieces: list[str], turn: int = -1) -> go.Figure:
    """Slot × step: the key / value bit-width each slot is stored at as each decode step sees it (runs whose cache
    format rounds as slots leave a window: KIVI)."""
    cache_format = result.settings.cache_format
    bits = bits_grid(result, turn)
    n = bits.shape[0]
    labels = [spell_slot(slot, pieces[slot]) for slot in range(n)]
    data = [dict(type="heatmap", z=bits, x=np.arange(bits.shape[1]), y=labels, zmin=cache_format.window_bits[0],
                 zmax=16,
                 colorscale=[[0, "#f2994a"], [1, "#2f80ed"]], colorbar=dict(title="key bits"),
                 hovertemplate="step %{x} · slot %{y}<br>keys at %{z} bits<extra></extra>")]
    height = grid_height(n)
    layout = dict(height=height, margin=dict(l=10, r=10, t=30, b=10), xaxis_title="decode step",
                  yaxis=slot_axis(labels, height), title=plain_title(cache_format.label))
    return go.Figure(dict(data=data, layout=layout))


LABEL_PX = 14  # a slot label's line (plotly's 12 px font and its spacing): fewer labels than fit never overprint


def grid_height(n: int) -> int:
    """A slot × step grid's height in px for ``n`` slots: 6 px a slot above 160 px of frame, at most 900."""
    return min(900, 160 + 6 * n)


def slot_axis(labels: list[str], height: int) -> dict:
    """A slot axis naming each slot's token, every k-th slot when not all fit a figure ``height`` px high (the
    frame's 70 px off): labels never overprint, and a long run keeps some."""
    fit = max(1, (height - 70) // LABEL_PX)
    every = -(-len(labels) // fit)
    return dict(title="slot" if every == 1 else f"slot (every {ordinal(every)} named)", autorange="reversed",
                type="category", tickvals=labels[::every])


def _where(layer: int | None, kv_head: int | None) -> str:
    return ", ".join(f"{name} {value}" for name, value in (("layer", layer), ("KV head", kv_head)) if value is not None)


def timeline_title(gone: int, layer: int | None = None, kv_head: int | None = None) -> str:
    """The eviction timeline's title: the layer / KV head it shows (all by default) and how many slots left it (for
    all: left at least one layer or KV head)."""
    where = _where(layer, kv_head)
    return (f"Eviction timeline of {where or 'all layers and KV heads'}: {gone} slot{'' if gone == 1 else 's'} "
            f"evicted from {where or 'at least one layer or KV head'}")


def plain_title(text: str) -> str:
    """Plotly titles accept a few HTML tags: show ``text`` literally."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
