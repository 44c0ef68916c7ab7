"""Slide versions of the figures the app draws with plotly (cache growth, the attention overview, one head's map, the
current row, a policy run's KL, cache size, eviction timeline and bit-widths, and the channel view's map and error
per key channel), as Vega-Lite specs that
:func:`kvviz.figures.slides.to_png` / :func:`~kvviz.figures.slides.to_svg` render offline.

plotly's own static export needs a Chrome browser (kaleido); these specs are built from the same numbers as the app's
figures and need nothing but vl-convert. Each is captioned with the model, the step and the edit.
"""

from __future__ import annotations

import numpy as np

from kvviz.edit.edit import Edit
from kvviz.figures.policy_run_charts import STEP_TITLE, bits_grid, seen_grid, timeline_title
from kvviz.figures.slides import (QUANTIZER_COLOURS, SEGMENT_SCALE, THEME, TOKEN_AXIS, WIDTH, describe, heading,
                                  token_labels)
from kvviz.runs.policy_run import PolicyRun
from kvviz.transcript import SEGMENTS, Transcript

PLOT_WIDTH, PLOT_HEIGHT = WIDTH - 2 * 24 - 220, 640  # the plot area of a slide (room for the axis and a legend)


def caption(model: str, at: int, edit: Edit) -> str:
    """The caption of a figure of the step of slot ``at`` on a cache with the committed ``edit``."""
    return f"{model} · step {at} · {'committed: ' + describe(edit) if not edit.is_empty else 'full cache'}"


def _framed(spec: dict, title: str, caption_text: str) -> dict:
    return {"title": heading(title, caption_text), "config": THEME, **spec}


def _slot_axis(texts: list[str], title: str = "slot", limit: int = TOKEN_AXIS, **style) -> dict:
    """Up to ``limit`` slots an axis labels each slot with its token (``style``: label settings other than the
    slanted 13-px default); beyond, with its number."""
    if len(texts) > limit:
        return {"title": title}
    return {"title": f"{title} and token", "labelExpr": token_labels(dict(enumerate(texts))),
            "values": list(range(len(texts))), **({"labelAngle": -60, "labelFontSize": 13} | style)}


def growth_slide(transcript: Transcript, caption_text: str) -> dict:
    """Cache length after every forward pass, stacked by segment (:func:`kvviz.figures.growth`'s numbers)."""
    rows = [{"pass": event.step, "segment": segment, "slots": getattr(event, segment), "kind": event.kind}
            for event in transcript.growth for segment in SEGMENTS]
    return _framed({
        "data": {"values": rows}, "width": PLOT_WIDTH, "height": PLOT_HEIGHT, "mark": {"type": "bar"},
        "encoding": {"x": {"field": "pass", "type": "ordinal", "title": "forward pass",
                           "axis": {"labelOverlap": "greedy", "labelAngle": 0}},
                     "y": {"field": "slots", "type": "quantitative", "stack": "zero", "title": "cached slots"},
                     "color": {"field": "segment", "type": "nominal", "scale": SEGMENT_SCALE, "sort": list(SEGMENTS)},
                     "order": {"field": "order", "type": "quantitative"}},
        "transform": [{"calculate": f"indexof({list(SEGMENTS)}, datum.segment)", "as": "order"}]},
        "Cache growth: a prefill jumps, a decode step adds one", caption_text)


def overview_slide(rows: np.ndarray, kv_heads: int, at: int, caption_text: str) -> dict:
    """``rows`` ``(L, H, B)`` (:func:`kvviz.view_data.overview`): one panel per query head, layers down, keys across
    (max-pooled to B bins)."""
    layers, heads, bins = rows.shape
    group = heads // kv_heads
    values = [{"head": f"h{h} · KV{h // group}", "layer": layer, "bin": b, "weight": float(rows[layer, h, b])}
              for h in range(heads) for layer in range(layers) for b in range(bins)]
    order = [f"h{h} · KV{h // group}" for h in range(heads)]
    view = {"width": max(60, PLOT_WIDTH // heads - 12), "height": PLOT_HEIGHT, "mark": "rect", "encoding": {
        "x": {"field": "bin", "type": "ordinal", "axis": None},
        "y": {"field": "layer", "type": "ordinal", "title": "layer", "axis": {"labelOverlap": "greedy"}},
        "color": {"field": "weight", "type": "quantitative", "title": "α", "scale": {"scheme": "viridis"}}}}
    return _framed({"data": {"values": values}, "facet": {"column": {"field": "head", "type": "nominal",
                                                                      "sort": order, "title": None}},
                    "spec": view, "spacing": 8},
                   f"Attention of slot {at}: every layer × query head (keys left → right, max-pooled)", caption_text)


def head_map_slide(weights: np.ndarray, block: int, boundaries: list[tuple[int, str]], title: str,
                   caption_text: str, texts: list[str] | None = None) -> dict:
    """One head's causal map ``weights`` ``(m, m)`` (:func:`kvviz.view_data.head_map`, ``block`` slots per cell):
    queries down, keys across, a dotted line where a segment or turn starts; with the slots' ``texts``, tokens on
    both axes up to :data:`TOKEN_AXIS` slots."""
    m = weights.shape[0]
    named = texts is not None and block == 1 and m <= TOKEN_AXIS
    values = [{"q": q * block, "k": k * block, "weight": float(weights[q, k])}
              for q in range(m) for k in range(m if block > 1 else q + 1)]
    side = m * block
    scale = {"domain": [0, side], "nice": False, "zero": True}
    cell = [{"calculate": f"datum.q + {block}", "as": "q2"}, {"calculate": f"datum.k + {block}", "as": "k2"}]
    marks = [{"data": {"values": values}, "transform": cell, "mark": "rect", "encoding": {
        "x": {"field": "k", "type": "quantitative", "scale": scale,
              "axis": _slot_axis(texts, "key slot") if named else {"title": "key slot"}}, "x2": {"field": "k2"},
        "y": {"field": "q", "type": "quantitative", "scale": {**scale, "reverse": True},
              "axis": _slot_axis(texts, "query slot", labelAngle=0) if named else {"title": "query slot"}},
        "y2": {"field": "q2"},
        "color": {"field": "weight", "type": "quantitative", "title": "α", "scale": {"scheme": "orangered"}}}}]
    if boundaries:
        edges = {"values": [{"slot": slot, "label": label} for slot, label in boundaries]}
        line = {"type": "rule", "color": "#2f80ed", "strokeDash": [3, 3]}
        marks += [{"data": edges, "mark": line, "encoding": {"x": {"field": "slot", "type": "quantitative"}}},
                  {"data": edges, "mark": line, "encoding": {"y": {"field": "slot", "type": "quantitative"}}},
                  {"data": edges, "mark": {"type": "text", "dy": -8, "align": "left", "fontSize": 13},
                   "encoding": {"x": {"field": "slot", "type": "quantitative"}, "y": {"datum": 0},
                                "text": {"field": "label"}}}]
    suffix = f" (max over {block}×{block} blocks)" if block > 1 else ""
    return _framed({"width": PLOT_HEIGHT, "height": PLOT_HEIGHT, "layer": marks}, title + suffix, caption_text)


def row_slide(row: list[float], texts: list[str], segments: list[str], title: str, caption_text: str) -> dict:
    """The current token's weights as bars over slots, coloured by segment; tokens on the axis up to
    :data:`TOKEN_AXIS` slots."""
    values = [{"slot": s, "weight": w, "segment": segment} for s, (w, segment) in enumerate(zip(row, segments))]
    return _framed({
        "data": {"values": values}, "width": PLOT_WIDTH, "height": 420,
        "mark": {"type": "bar", "size": max(1.0, 0.9 * PLOT_WIDTH / len(row))},
        "encoding": {"x": {"field": "slot", "type": "quantitative", "axis": _slot_axis(texts),
                           "scale": {"domain": [-0.5, len(row) - 0.5], "nice": False}},
                     "y": {"field": "weight", "type": "quantitative", "title": "α"},
                     "color": {"field": "segment", "type": "nominal", "scale": SEGMENT_SCALE}}},
        title, caption_text)


def run_caption(model: str, result: PolicyRun, turn: int) -> str:
    """The caption of a policy run's figure: the model, the turn and what the policy did."""
    index = turn % len(result.turns)
    return f"{model} · turn {index + 1}, {len(result.turns[turn].steps)} decode steps · {result.settings.label}"


def kl_slide(result: PolicyRun, turn: int, caption_text: str) -> dict:
    """KL(full ‖ policy) per step (-1: the prompt's last token), the steps where the top-1 differs marked
    (:func:`kvviz.figures.kl_steps`)."""
    run = result.turns[turn]
    values = [{"step": s.step, "kl": s.kl, "top-1": "agrees" if s.top1_agree else "differs"} for s in run.records]
    x = {"field": "step", "type": "quantitative", "title": STEP_TITLE, "axis": {"format": "d", "tickMinStep": 1}}
    marks = [{"mark": {"type": "line", "color": "#2f80ed"},
              "encoding": {"x": x, "y": {"field": "kl", "type": "quantitative", "title": "KL(full ‖ policy), nats"}}},
             {"mark": {"type": "point", "filled": True, "size": 120}, "encoding": {
                 "x": x, "y": {"field": "kl", "type": "quantitative"},
                 "shape": {"field": "top-1", "type": "nominal", "scale": {"domain": ["agrees", "differs"],
                                                                          "range": ["circle", "cross"]}},
                 "color": {"field": "top-1", "type": "nominal", "scale": {"domain": ["agrees", "differs"],
                                                                          "range": ["#2f80ed", "#d62728"]}}}}]
    if run.divergence is not None:
        marks.append({"data": {"values": [{"step": run.divergence}]},
                      "mark": {"type": "rule", "color": "#d62728", "strokeDash": [4, 4], "size": 2},
                      "encoding": {"x": {"field": "step", "type": "quantitative"}}})
    return _framed({"data": {"values": values}, "width": PLOT_WIDTH, "height": 480, "layer": marks},
                   "KL per step (teacher-forced on the full run's tokens)", caption_text)


def cache_size_slide(result: PolicyRun, turn: int, caption_text: str) -> dict:
    """Slots each step sees: the policy's by segment, the full cache's, the budget
    (:func:`kvviz.figures.cache_size`)."""
    run = result.turns[turn]
    records = run.records
    bars = [{"step": s.step, "segment": name, "slots": s.by_segment[name]} for s in records for name in SEGMENTS]
    lines = [{"step": s.step, "slots": s.slot, "series": "full cache"} for s in records]
    budget = result.settings.budget
    if isinstance(budget, int):
        lines += [{"step": s.step, "slots": budget, "series": "budget"} for s in records]
    x = {"field": "step", "type": "quantitative", "title": STEP_TITLE, "axis": {"format": "d", "tickMinStep": 1},
         "scale": {"domain": [-1.5, len(run.steps) - 0.5], "nice": False}}
    return _framed({"width": PLOT_WIDTH, "height": 480, "resolve": {"scale": {"color": "independent"}}, "layer": [
        {"data": {"values": bars}, "mark": {"type": "bar", "size": max(1.0, 0.9 * PLOT_WIDTH / len(records))},
         "encoding": {
            "x": x, "y": {"field": "slots", "type": "quantitative", "stack": "zero", "title": "slots seen"},
            "color": {"field": "segment", "type": "nominal", "scale": SEGMENT_SCALE, "title": "policy"}}},
        {"data": {"values": lines}, "mark": {"type": "line", "strokeWidth": 3}, "encoding": {
            "x": x, "y": {"field": "slots", "type": "quantitative"},
            "color": {"field": "series", "type": "nominal", "title": None,
                      "scale": {"domain": ["full cache", "budget"], "range": ["#222", "#d62728"]}}}}]},
        "Slots each step sees: the policy's (mean over layers and KV heads) and the full cache's", caption_text)


def _slot_grid(grid: np.ndarray, pieces: list[str], field: str, colour: dict, title: str, caption_text: str) -> dict:
    """Slot × step heatmap of ``grid`` ``(n, steps)`` (NaN: not cached yet), slots labelled by token up to 80."""
    n, steps = grid.shape
    values = [{"slot": slot, "step": step, field: float(grid[slot, step])}
              for slot in range(n) for step in range(steps) if not np.isnan(grid[slot, step])]
    axis = _slot_axis(pieces[:n], limit=80, labelAngle=0, labelFontSize=11)
    return _framed({"data": {"values": values}, "width": PLOT_WIDTH, "height": min(PLOT_HEIGHT, max(240, 10 * n)),
                    "transform": [{"calculate": "datum.slot + 1", "as": "slot2"},
                                  {"calculate": "datum.step + 1", "as": "step2"}],
                    "mark": "rect", "encoding": {
                        "x": {"field": "step", "type": "quantitative",
                              "title": "decode step (its cell starts at the tick)",
                              "axis": {"format": "d", "tickMinStep": 1},
                              "scale": {"domain": [0, steps], "nice": False}}, "x2": {"field": "step2"},
                        "y": {"field": "slot", "type": "quantitative", "axis": axis,
                              "scale": {"domain": [0, n], "reverse": True, "nice": False}}, "y2": {"field": "slot2"},
                        "color": {"field": field, "type": "quantitative", **colour}}}, title, caption_text)


def timeline_slide(result: PolicyRun, pieces: list[str], turn: int, caption_text: str, layer: int | None = None,
                   kv_head: int | None = None) -> dict:
    """The eviction timeline (:func:`kvviz.figures.timeline`'s numbers): the share of layers and KV heads that still
    see each slot at each decode step."""
    seen, gone = seen_grid(result, turn, layer, kv_head)
    colour = {"title": "seen", "scale": {"domain": [0, 1], "range": ["#f4f4f4", "#2f80ed"]}}
    return _slot_grid(seen, pieces, "seen", colour, timeline_title(gone, layer, kv_head), caption_text)


def bit_widths_slide(result: PolicyRun, pieces: list[str], turn: int, caption_text: str) -> dict:
    """The key bit-width of each slot at each decode step of a KIVI run (:func:`kvviz.figures.bit_widths`)."""
    cache_format = result.settings.cache_format
    colour = {"title": "key bits",
              "scale": {"domain": [cache_format.window_bits[0], 16], "range": ["#f2994a", "#2f80ed"]}}
    return _slot_grid(bits_grid(result, turn), pieces, "bits", colour, f"Bit-widths: {cache_format.label}",
                      caption_text)


def channel_slide(magnitudes: np.ndarray, texts: list[str], outliers: list[int], title: str,
                  caption_text: str) -> dict:
    """The Channels view's map for a slide: ``magnitudes`` ``(n, D)`` (slots down, channels across, tokens on the
    axis up to :data:`TOKEN_AXIS` slots) with a red triangle over each outlier channel."""
    n, dim = magnitudes.shape
    values = [{"slot": s, "channel": c, "magnitude": float(magnitudes[s, c])} for s in range(n) for c in range(dim)]
    y_axis = _slot_axis(texts[:n], "slot", labelAngle=0) if n <= TOKEN_AXIS else {"title": "slot"}
    marks = [{"data": {"values": values}, "mark": "rect", "encoding": {
        "x": {"field": "channel", "type": "ordinal", "axis": {"title": "channel", "labelAngle": 0,
                                                              "values": list(range(0, dim, 8))}},
        "y": {"field": "slot", "type": "ordinal", "axis": y_axis},
        "color": {"field": "magnitude", "type": "quantitative", "title": "|x|", "scale": {"scheme": "viridis"}}}}]
    if outliers:
        marks.append({"data": {"values": [{"channel": c} for c in outliers]},
                      "mark": {"type": "point", "shape": "triangle-down", "filled": True, "color": "#d62728",
                               "size": 120, "yOffset": -10},
                      "encoding": {"x": {"field": "channel", "type": "ordinal"}, "y": {"datum": 0, "type": "ordinal"}}})
    return _framed({"width": PLOT_WIDTH, "height": PLOT_HEIGHT, "layer": marks}, title, caption_text)


def channel_errors_slide(peaks: np.ndarray, errors: dict[str, np.ndarray], outliers: list[int], bits: int, title: str,
                         caption_text: str) -> dict:
    """The Channels view's error chart for a slide: per key channel its largest magnitude ``peaks`` ``(D,)`` (bars,
    red for the outlier channels, right axis) and the RMS error each quantizer of ``errors`` leaves there (``(D,)``
    each, lines, left axis) — at 4 bits NVFP4's and MXFP4's blocks of consecutive channels show as steps."""
    bars = [{"channel": c, "peak": float(p), "outlier": c in outliers} for c, p in enumerate(peaks)]
    lines = [{"channel": c, "error": float(e), "quantizer": f"{bits}-bit {name}"}
             for name, error in errors.items() for c, e in enumerate(error)]
    names = [f"{bits}-bit {name}" for name in errors]
    x = {"field": "channel", "type": "quantitative", "axis": {"title": "channel", "tickMinStep": 8}}
    layers = [
        {"data": {"values": bars}, "mark": {"type": "bar", "opacity": 0.45}, "encoding": {
            "x": x, "y": {"field": "peak", "type": "quantitative", "axis": {"title": "max |k|", "orient": "right"}},
            "color": {"field": "outlier", "type": "nominal", "legend": None,
                      "scale": {"domain": [False, True], "range": ["#b0b0b0", "#d62728"]}}}},
        {"data": {"values": lines}, "mark": {"type": "line", "strokeWidth": 2}, "encoding": {
            "x": x, "y": {"field": "error", "type": "quantitative", "axis": {"title": "RMS error of k̂ − k"}},
            "color": {"field": "quantizer", "type": "nominal", "title": None, "sort": names,
                      "scale": {"domain": names, "range": QUANTIZER_COLOURS[:len(names)]},
                      "legend": {"orient": "bottom", "columns": 3}}}},
    ]
    return _framed({"width": PLOT_WIDTH, "height": PLOT_HEIGHT - 60, "layer": layers,
                    "resolve": {"scale": {"y": "independent", "color": "independent"}}}, title, caption_text)
