"""Figures for slides: PNG (1920 px wide at scale 1, 3840 at 2) and SVG, on a light theme, with a caption naming the
model, the step and the edit. Rendered offline by vl-convert (no request is allowed: ``allowed_base_urls=[]``).

Each figure is a Vega-Lite spec built from the what-if's own numbers: the α chart (slots labelled by their tokens up to
:data:`TOKEN_AXIS` slots), the layer × head maps, the hidden-state change, the next-token tables with the headline
numbers, and the strip of the cache.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping

import vl_convert

from kvviz.edit.edit import Edit
from kvviz.figures.growth import SEGMENT_COLOURS
from kvviz.figures.whatif_charts import Chart, alpha_chart, head_grid_chart, hidden_chart
from kvviz.spelling import spell, spell_slot
from kvviz.whatif import WhatIf
from kvviz.whatif.metrics import NextToken

WIDTH, HEIGHT = 1920, 1080  # px of a slide at scale 1
TOKEN_AXIS = 100  # up to this many slots the α chart's axis names each slot's token
THEME = {"background": "white", "font": "DejaVu Sans", "padding": 24,
         "title": {"fontSize": 30, "subtitleFontSize": 20, "subtitleColor": "#555", "anchor": "start"},
         "axis": {"labelFontSize": 16, "titleFontSize": 18},
         "legend": {"labelFontSize": 16, "titleFontSize": 16, "labelLimit": 400},
         "header": {"labelFontSize": 18}, "view": {"stroke": None}}
# plotly figures (growth, attention maps, policy runs): the chart's own camera button saves a 1920×1080 PNG, drawn in
# the browser (no request); their slide versions (light theme, captioned, PNG or SVG) are in figures/plot_slides.py
PLOTLY_CONFIG = {"toImageButtonOptions": {"format": "png", "width": WIDTH, "height": HEIGHT, "scale": 1,
                                          "filename": "kvviz-figure"}, "displaylogo": False}
QUANTIZER_COLOURS = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]  # the channel errors' lines
SEGMENT_SCALE = {"domain": list(SEGMENT_COLOURS), "range": list(SEGMENT_COLOURS.values())}  # the app's colours


def slide(chart: Chart, title: str, caption: str) -> dict:
    """``chart`` as a standalone spec sized for a 1920-px-wide slide, with ``title`` and the ``caption`` under it."""
    spec = copy.deepcopy(chart.to_dict())
    spec["title"] = heading(title, caption)
    spec["config"] = THEME
    if "layer" in spec or "mark" in spec:  # a single view: stretch it over the slide
        spec["width"], spec["height"] = WIDTH - 2 * 24 - 120, 640
    return spec


def heading(title: str, caption: str, width: int = 130) -> dict:
    """A slide's title, the caption under it in lines of up to ``width`` characters (broken at its " · ")."""
    lines: list[str] = []
    for part in caption.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return {"text": title, "subtitle": lines}


def alpha_slide(chart: Chart, caption: str) -> dict:
    """The α chart for a slide: up to :data:`TOKEN_AXIS` slots, the axis shows ``slot token`` instead of the slot."""
    data = chart.data
    spec = slide(Chart(chart.spec, data), "Attention weights of the step: α, α′ and the edited run", caption)
    if data["slot"].nunique() <= TOKEN_AXIS:
        expression = token_labels({int(s): t for s, t in zip(data["slot"], data["token"])})
        for layer in spec["layer"]:
            x = layer["encoding"]["x"]
            x["axis"] = {"labelExpr": expression, "labelAngle": -60, "labelFontSize": 13, "title": "slot and token"}
    return spec


def token_labels(texts: Mapping[int, str]) -> str:
    """A Vega ``labelExpr`` naming each slot of an axis ``"slot token"`` (``texts``: slot → token text)."""
    return " : ".join(f"datum.value == {s} ? {_js(spell_slot(s, t))}" for s, t in texts.items()) + " : ''"


def _js(text: str) -> str:
    """A string literal for a Vega expression, safe for any token text (JSON's escapes: also \\r, U+2028, U+2029)."""
    return json.dumps(text)


def topk_slide(next_token: NextToken, caption: str) -> dict:
    """The next-token distributions side by side (full and edited cache), each token with its probability and rank
    change, and the headline numbers in the title."""
    rows = []
    for side, candidates in (("full cache", next_token.full), ("edited cache", next_token.edited)):
        for c in candidates:
            moved = c.rank_other - c.rank if side == "full cache" else c.rank - c.rank_other
            rows.append({"side": side, "token": f"{c.rank + 1}. {spell(c.text)}", "p": c.prob,
                         "note": f"{c.prob:.3f}  (rank {c.rank_other + 1} in the other{'' if not moved else f', {moved:+d}'})"})
    top1 = "top-1 FLIPS" if next_token.top1_changed else "top-1 unchanged"
    base = {"encoding": {"y": {"field": "token", "type": "nominal", "sort": None, "title": None,
                               "axis": {"labelFontSize": 18, "labelLimit": 360}}}}
    view = {**base, "width": 560, "height": 40 * max(len(next_token.full), 1), "layer": [
        {"mark": {"type": "bar", "color": "#2f80ed"}, "encoding": {"x": {"field": "p", "type": "quantitative",
                                                                        "scale": {"domain": [0, 1]}, "title": "p"}}},
        {"mark": {"type": "text", "align": "left", "dx": 6, "fontSize": 15},
         "encoding": {"x": {"field": "p", "type": "quantitative"}, "text": {"field": "note"}}}]}
    return {"data": {"values": rows}, "facet": {"column": {"field": "side", "type": "nominal", "title": None,
                                                           "sort": ["full cache", "edited cache"]}},
            "spec": view, "resolve": {"scale": {"y": "independent"}},
            "title": heading(f"Next token: KL {next_token.kl:.3g} nats · total variation {next_token.tv:.3g} · {top1}",
                             caption), "config": THEME}


STRIP_FONT = 20  # px of the strip slide's monospaced text; DejaVu Sans Mono advances 0.602 em a character
STRIP_WIDTH = WIDTH - 2 * 24 - 160  # the strip's plot: the slide less its padding and the legends


def strip_slide(chips: list[list], caption: str) -> dict:
    """The strip as a figure: one box per slot (``chips`` as :func:`kvviz.view_data.strip_chips` gives them), each as
    wide as its text, wrapped at the slide's width, red by attention (as the strip shades it), a band by segment,
    evicted ones faded."""
    per_line = int(STRIP_WIDTH // (0.61 * STRIP_FONT))  # characters a line holds (a box: its text and one more)
    rows, x, y = [], 0, 0
    for chip in chips:
        text = chip[1][:24]
        width = len(text) + 1
        if x and x + width > per_line:
            x, y = 0, y + 1
        rows.append({"x": x, "x2": x + width - 0.3, "y": y, "text": text, "attention": chip[4],
                     "segment": ["history", "query", "generated"][chip[2]], "evicted": bool(chip[5] or chip[11])})
        x += width
    lines = y + 1
    scale = {"x": {"domain": [0, per_line], "nice": False}, "y": {"domain": [0, lines], "reverse": True, "nice": False}}
    x = {"field": "x", "type": "quantitative", "axis": None, "scale": scale["x"]}
    y_top = {"field": "y", "type": "quantitative", "axis": None, "scale": scale["y"]}
    return {
        "data": {"values": rows}, "width": STRIP_WIDTH, "height": 40 * lines,
        "title": heading("The KV cache, one box per slot", caption), "config": THEME,
        "transform": [{"calculate": "datum.y + 0.85", "as": "y2"}, {"calculate": "datum.y + 1", "as": "band"}],
        "layer": [
            {"mark": {"type": "rect", "cornerRadius": 3},
             "encoding": {"x": x, "x2": {"field": "x2"}, "y": y_top, "y2": {"field": "y2"},
                          "color": {"field": "attention", "type": "quantitative", "title": "attention",
                                    "scale": {"domain": [0, 1], "range": ["#ffffff", "#eb5757"]}}}},
            {"mark": {"type": "rect"}, "encoding": {"x": x, "x2": {"field": "x2"}, "y": {"field": "y2", "type": "quantitative",
                                                                                         "scale": scale["y"], "axis": None},
                                                    "y2": {"field": "band"},
                                                    "fill": {"field": "segment", "type": "nominal", "title": "segment",
                                                             "scale": SEGMENT_SCALE}}},
            {"mark": {"type": "text", "align": "left", "dx": 5, "dy": 16, "font": "DejaVu Sans Mono",
                      "fontSize": STRIP_FONT},
             "encoding": {"x": x, "y": y_top, "text": {"field": "text"},
                          "opacity": {"condition": {"test": "datum.evicted", "value": 0.35}, "value": 1}}},
        ]}


def describe(edit: Edit) -> str:
    """One line for a caption: what ``edit`` evicts, quantizes, prunes and merges."""
    parts = []
    if edit.evicted_slots():
        slots = sorted(edit.evicted_slots())
        parts.append(f"evict {len(slots)} slot{'s' * (len(slots) != 1)} ({', '.join(map(str, slots[:6]))}"
                     f"{', …' if len(slots) > 6 else ''})")
    widths = sorted(set(edit.key_bits.values()) | set(edit.value_bits.values()))
    if widths:
        parts.append(f"quantize {len(set(edit.key_bits) | set(edit.value_bits))} slots to "
                     f"{'/'.join(map(str, widths))} bits")
    if edit.prunings:
        parts.append(f"prune {sum(len(p.channels) for p in edit.prunings)} key channels in {len(edit.prunings)} heads")
    if edit.merges:
        parts.append(f"merge {len(edit.merges)} values ({edit.merge_rule})")
    return "; ".join(parts) or "no edit"


def whatif_slides(result: WhatIf, chips: list[list], model: str) -> dict[str, dict]:
    """Every figure of one what-if for slides, by name, each captioned with the model, the step, the edit and the
    detail head (``chips``: the strip as :func:`kvviz.view_data.strip_chips` gives it for the same step)."""
    detail = result.detail
    caption = (f"{model} · step {result.at} · {describe(result.edit)} · layer {detail.layer}, "
               f"head {detail.head}")
    texts = [chip[1] for chip in chips]
    return {
        "strip": strip_slide(chips, caption),
        "next-token tables": topk_slide(result.next_token, caption),
        "attention weights (α, α′)": alpha_slide(alpha_chart(detail, texts), caption),
        "ρ and Δo maps": slide(head_grid_chart(result.heads), "Evicted mass ρ and output change ‖Δo‖ per head",
                               caption),
        "hidden-state change": slide(hidden_chart(result.hidden_delta), "Hidden-state change by layer", caption),
    }


def to_png(spec: dict, scale: float = 1) -> bytes:
    """PNG bytes that fill a :data:`WIDTH` × :data:`HEIGHT` slide (``scale`` 2: twice, for a 4K projector): as wide
    as the slide, or as high where that would be too high. A spec's own size leaves its legends and labels to Vega's
    layout, so the figure is measured first (as SVG) and drawn at the scale that fills the slide, rendered offline."""
    svg = to_svg(spec)
    width, height = (float(re.search(rf'{side}="([\d.]+)"', svg).group(1)) for side in ("width", "height"))
    exact = scale * min((WIDTH + 0.25) / width, (HEIGHT + 0.25) / height)  # + ¼ px: the drawn size is floored
    return vl_convert.vegalite_to_png(spec, scale=exact, allowed_base_urls=[])


def to_svg(spec: dict) -> str:
    """SVG text, rendered offline."""
    return vl_convert.vegalite_to_svg(spec, allowed_base_urls=[])
