"""What-if charts (Vega-Lite specs) and tables: α / α′ per slot, layer × head maps of ρ and ‖Δo‖, hidden-state
deltas, top-k tables."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from kvviz.spelling import spell
from kvviz.view_data import pool
from kvviz.whatif import Detail
from kvviz.whatif.metrics import NextToken


# Vega-Lite specs, not plotly figures: a click on the strip redraws all three charts. Streamlit keeps a keyed Vega-Lite
# chart and swaps its data in place while the spec is unchanged (the specs hold no per-click values), whereas it
# remounts a plotly chart whose figure changed; measured at 1k slots on 2 cores, the browser's last long task of a
# click ended at ~0.55–0.75 s instead of ~0.9 s. Plain dicts: Altair validates as it builds (~0.18 s for these three
# at 1k); the tests check the specs against the Vega-Lite schema. Quantitative scales get explicit domains: Streamlit
# runs a chart once before its data arrives, and a domain left to the data then logs "Infinite extent" warnings. Their
# maxima are rounded up to 1, 2 or 5 × 10^k (:func:`nice_max`), so most clicks keep the spec and only swap the data.
SERIES = {"full": ("α full", "#7f8c9a"), "renorm": ("α′ = α/(1−ρ)", "#2f80ed"),
          "edited": ("α used by the edited run", "#f2994a")}
BAR_LIMIT = 128  # up to this many slots α is drawn as grouped bars, above as step lines (one bar would be < 3 px)
POINT_LIMIT = 1024  # above this many slots, blocks of slots (a chart is ~1,000 px wide; at 8k slots the browser spent
# ~0.65 s of each click evaluating and drawing 24,000 points of the three series)
MAPS = {"rho": "evicted mass ρ", "delta_isolated": "‖Δo‖ isolated", "delta_propagated": "‖Δo‖ propagated"}


def nice_max(values) -> float:
    """The smallest of 1, 2, 5 × 10^k at or above the largest of ``values`` (1 for nothing above 0)."""
    top = float(np.nanmax(np.asarray(values, dtype=float), initial=0.0))
    if not top > 0 or not np.isfinite(top):
        return 1.0
    power = 10.0 ** np.floor(np.log10(top))
    return next(float(step * power) for step in (1, 2, 5, 10) if step * power >= top * (1 - 1e-12))


@dataclass
class Chart:
    """A Vega-Lite ``spec`` over one table, ``data``: the page passes them separately (the data updates in place)."""

    spec: dict
    data: pd.DataFrame

    def to_dict(self) -> dict:
        """The spec with its data inline (a standalone Vega-Lite chart)."""
        return {"data": {"values": self.data.to_dict("records")}, **self.spec}


def _field(name: str, kind: str, **settings) -> dict:
    return {"field": name, "type": kind, **settings}


def alpha_chart(detail: Detail, texts: list[str]) -> Chart:
    """α (full cache), α′ = α/(1−ρ) (closed form) and the weights the edited run used, per slot; evicted slots are
    crossed (their α′ and edited weight are 0); a model with learned sinks has the sink's mass as a column of its own
    (slot −1, token "sink"). Hovering a slot shows its token and the weight. Over
    :data:`POINT_LIMIT` slots, each series is drawn as its maximum over blocks of ``ceil(n / POINT_LIMIT)`` slots
    (as the attention maps do), a block crossed when it holds an evicted slot; the title says so."""
    n = len(detail.slots)
    zero = lambda values: [0.0 if v is None else v for v in values]  # noqa: E731
    weights = [np.asarray(w, dtype=float) for w in (detail.alpha_full, zero(detail.alpha_renorm),
                                                    zero(detail.alpha_edited))]
    flags = [np.asarray([v is None for v in detail.alpha_renorm]), np.asarray(detail.outside or [False] * n)]
    slots, labels, block = np.asarray(detail.slots), np.array([spell(t) for t in texts], dtype=object), 1
    if n > POINT_LIMIT:
        block = -(-n // POINT_LIMIT)
        weights = [pool(w, POINT_LIMIT, 0) for w in weights]
        flags = [pool(f.astype(float), POINT_LIMIT, 0) > 0 for f in flags]
        slots = slots[::block]
        labels = np.array([f"slots {a}–{min(a + block, n) - 1}" for a in slots], dtype=object)
    if detail.sink is not None:  # a learned sink: one more column, before slot 0, with its three masses
        weights = [np.concatenate([[mass], w]) for mass, w in zip(detail.sink, weights)]
        flags = [np.concatenate([[False], f]) for f in flags]
        slots, labels = np.concatenate([[-1], slots]), np.concatenate([np.array(["sink"], dtype=object), labels])
    count = len(slots)
    data = pd.DataFrame({
        "slot": np.tile(slots, 3), "token": np.tile(labels, 3),
        "series": np.repeat([name for name, _ in SERIES.values()], count), "weight": np.concatenate(weights),
        "evicted": np.tile(flags[0], 3), "outside": np.tile(flags[1], 3)})
    names = [name for name, _ in SERIES.values()]
    if n <= BAR_LIMIT:  # few slots: each is named by its token on the axis
        names_of = json.dumps({str(slot): str(label) for slot, label in zip(slots.tolist(), labels)}, ensure_ascii=False)
        x = _field("slot", "ordinal", title="slot · token", axis={
            "labelExpr": f"datum.value + ' ' + {names_of}[datum.value]", "labelAngle": -60, "labelLimit": 90})
        marks = [{"mark": "bar", "encoding": {"x": x, "xOffset": _field("series", "nominal", sort=names),
                                              "y": _field("weight", "quantitative", stack=None)}}]
    else:
        x = _field("slot", "quantitative", title="slot", scale={"domain": [int(slots[0]), n - 1], "nice": False})
        marks = [{"mark": {"type": "line", "interpolate": "step", "strokeWidth": 1}, "encoding": {"x": x}},
                 {"mark": {"type": "point", "opacity": 0, "size": 20}, "encoding": {"x": x}}]  # hover targets
    crosses = {"transform": [{"filter": f"datum.evicted && datum.series == '{names[0]}'"}],
               "mark": {"type": "point", "shape": "cross", "size": 70, "filled": True},
               "encoding": {"x": x, "color": {"value": "#eb5757"}}}
    windowed = bool(detail.outside) and any(detail.outside)
    dropped = {"transform": [{"filter": f"datum.outside && datum.series == '{names[0]}'"}],
               "mark": {"type": "point", "shape": "square", "size": 30, "filled": True},
               "encoding": {"x": x, "color": {"value": "#9e9e9e"}}}
    spec = {
        "title": f"Layer {detail.layer}, head {detail.head}: attention weights of the step (evicted slots crossed"
                 + ("; slot −1: the learned sink's mass" if detail.sink is not None else "")
                 + ("; grey squares: outside this layer's sliding window" if windowed else "")
                 + (f"; the maximum over each block of {block} slots" if block > 1 else "") + ")",
        "height": 300, "layer": [*marks, crosses, *([dropped] if windowed else [])],
        "encoding": {"y": _field("weight", "quantitative", title="weight",
                                 scale={"domain": [0, nice_max(data["weight"])]}),
                     "color": _field("series", "nominal", scale={"domain": names, "range": [c for _, c in SERIES.values()]},
                                     legend={"orient": "bottom", "title": None}),
                     "tooltip": [_field("slot", "quantitative"), _field("token", "nominal"), _field("series", "nominal"),
                                 _field("weight", "quantitative", format=".4f")]}}
    return Chart(spec, data)


def head_grid_chart(heads: Mapping[str, torch.Tensor], width: int = 200) -> Chart:
    """Layer × query head maps ``(L, H)`` side by side, each ``width`` px wide: ρ (scale 0–1), ‖Δo‖ isolated
    (full-cache query) and ‖Δo‖ propagated (the real edited run), the two ‖Δo‖ maps on one colour scale."""
    layers, count = heads["rho"].shape
    data = pd.DataFrame({
        "layer": np.tile(np.repeat(np.arange(layers), count), len(MAPS)),
        "head": np.tile(np.arange(count), layers * len(MAPS)),
        "map": np.repeat(list(MAPS.values()), layers * count),
        "value": np.concatenate([heads[key].detach().cpu().double().numpy().ravel() for key in MAPS])})

    def grid(scale: dict) -> dict:
        return {"mark": "rect", "width": width, "height": layers * 11, "encoding": {
            "x": _field("head", "ordinal", title="query head"), "y": _field("layer", "ordinal", title="layer"),
            "color": _field("value", "quantitative", scale={"scheme": "viridis", **scale}, title=None,
                            legend={"gradientLength": layers * 9}),
            "tooltip": [_field("map", "nominal"), _field("layer", "ordinal"), _field("head", "ordinal"),
                        _field("value", "quantitative", format=".4g")]}}

    deltas = [MAPS["delta_isolated"], MAPS["delta_propagated"]]
    spec = {"hconcat": [
        {"title": MAPS["rho"], "transform": [{"filter": {"field": "map", "equal": MAPS["rho"]}}],
         "params": [{"name": "cell", "select": {"type": "point", "fields": ["layer", "head"], "on": "click"}}],
         **grid({"domain": [0, 1]})},
        {"transform": [{"filter": {"field": "map", "oneOf": deltas}}],
         "facet": {"column": _field("map", "nominal", title=None, sort=deltas)},
         "spec": grid({"domain": [0, nice_max(data.loc[data["map"].isin(deltas), "value"])]})},
    ], "resolve": {"scale": {"color": "independent"}}, "autosize": {"type": "pad"}}  # "fit" is for single views
    return Chart(spec, data)


def hidden_chart(hidden_delta: list[float]) -> Chart:
    """‖h̃ − h‖ after the embeddings and after each layer — the last point after the final norm too, as transformers
    returns it: how the edit propagates (docs/math.md §6)."""
    count = len(hidden_delta)
    names = ["embeddings", *map(str, range(1, count - 1)), f"{count - 1} + final norm"]
    data = pd.DataFrame({"layer": names, "delta": hidden_delta})
    spec = {"title": "Hidden-state change by layer", "height": 220, "mark": {"type": "line", "point": True},
            "encoding": {"x": _field("layer", "ordinal", title="after layer", sort=names,
                                            axis={"labelAngle": 0, "labelOverlap": True}),
                         "y": _field("delta", "quantitative", title="‖h̃ − h‖",
                                     scale={"domain": [0, nice_max(hidden_delta)]}),
                         "tooltip": [_field("layer", "ordinal"), _field("delta", "quantitative", format=".4g")]}}
    return Chart(spec, data)


def topk_frame(next_token: NextToken, side: str) -> pd.DataFrame:
    """The top-k table of one side (``full`` or ``edited``) with the rank in the other and the logit change."""
    rows = next_token.full if side == "full" else next_token.edited
    return pd.DataFrame({
        "token": [spell(c.text) for c in rows],
        "p": [c.prob for c in rows],
        "rank": [c.rank + 1 for c in rows],
        "rank other": [c.rank_other + 1 for c in rows],
        "Δrank": [c.rank_other - c.rank for c in rows] if side == "full" else [c.rank - c.rank_other for c in rows],
        "Δlogit": [c.logit_delta for c in rows],
    })
