"""Slide versions of the plotly figures (growth, attention overview / head map / row, a policy run's charts): valid
PNG (≤ 1920 px wide, twice at scale 2) and SVG carrying the caption, holding the same numbers as the figure the app
draws (read back from the plotly figure), rendered without any request."""

from __future__ import annotations

import math
import struct
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from kvviz import figures
from kvviz.edit.edit import Edit
from kvviz.figures import plot_slides, slides
from kvviz.policies import H2O
from kvviz.runs.compressed import RunSettings
from kvviz.schemes.kivi import Kivi
from kvviz.runs.policy_run import run_policy
from kvviz.session import Session
from kvviz.view_data import attention_row, head_map, overview


@pytest.fixture(scope="module")
def chat(lm):
    session = Session(lm)
    session.add_user_turn('A "quoted" <b>name</b>: Whiskers. Say it.')
    session.generate(6)
    session.commit(Edit.evict([3, 4]))
    session.add_user_turn("Again?")
    session.generate(4)
    return session


@pytest.fixture(scope="module")
def run(lm):
    return run_policy(lm, ["Name three cats."], RunSettings(H2O(), 20, "decode", 1, Kivi(2, 2, 8, 8)), 8)


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


def _check_renders(spec: dict, caption: str) -> None:
    width, height = _png_size(slides.to_png(spec))
    # "PNG, 1920 px" fills a 1920×1080 slide, legends included: as wide as it, or as high (a tall figure)
    assert width <= slides.WIDTH and height <= slides.HEIGHT and (width == slides.WIDTH or height == slides.HEIGHT)
    double = _png_size(slides.to_png(spec, scale=2))
    assert abs(double[0] - 2 * width) <= 1 and abs(double[1] - 2 * height) <= 1  # each side floored on its own
    svg = ET.fromstring(slides.to_svg(spec))
    natural = float(svg.get("width")), float(svg.get("height"))  # the SVG at Vega's own size, same proportions
    assert svg.tag.endswith("svg") and 600 <= natural[0] and height == pytest.approx(natural[1] * width / natural[0],
                                                                                      abs=1)
    text = " ".join(svg.itertext())
    assert all(part in text for part in caption.split(" · ")), caption


def _values(spec: dict, layer: int | None = None) -> list[dict]:
    return (spec["layer"][layer] if layer is not None else spec)["data"]["values"]


def test_the_caption_names_model_step_and_committed_edit(chat):
    at = len(chat) - 1
    assert plot_slides.caption("M", at, chat.commits.edit_at(at)) == f"M · step {at} · committed: evict 2 slots (3, 4)"
    assert plot_slides.caption("M", 2, chat.commits.edit_at(2)) == "M · step 2 · full cache"


def test_growth_and_attention_slides_show_the_apps_numbers(chat):
    at, lm = len(chat) - 1, chat.lm
    caption = plot_slides.caption(lm.name, at, chat.commits.edit_at(at))

    growth = plot_slides.growth_slide(chat.transcript, caption)
    for trace in figures.growth(chat.transcript).data:  # the app's bars, segment by segment
        assert [v["slots"] for v in _values(growth) if v["segment"] == trace.name] == list(trace.y)

    rows = overview(chat, at)
    values = _values(plot_slides.overview_slide(rows, lm.kv_heads, at, caption))
    assert len(values) == rows.size
    assert np.array([v["weight"] for v in values]).reshape(rows.shape[1], rows.shape[0], -1).transpose(1, 0, 2).tolist() \
        == rows.astype(float).tolist()

    weights, block = head_map(chat, 3, 2, 160)
    shown = figures.head_map_figure(weights, block, chat.transcript.boundaries(), "t").data[0].z
    spec = plot_slides.head_map_slide(weights, block, chat.transcript.boundaries(), "Layer 3, head 2", caption)
    cells = {(v["q"], v["k"]): v["weight"] for v in _values(spec, 0)}
    assert cells == {(q, k): float(shown[q, k]) for q in range(len(shown)) for k in range(len(shown))
                     if not math.isnan(shown[q, k])}  # the causal triangle, as the app draws it
    assert [(v["slot"], v["label"]) for v in spec["layer"][1]["data"]["values"]] == chat.transcript.boundaries()
    named = plot_slides.head_map_slide(weights, block, [], "m", caption, [s.text for s in chat.transcript.slots])
    assert '"0 <|im_start|>"' in named["layer"][0]["encoding"]["y"]["axis"]["labelExpr"]  # ≤ 100 slots: tokens
    _check_renders(named, caption)

    row = attention_row(chat, at, 3, 2).tolist()
    texts = [s.text for s in chat.transcript.slots[: at + 1]]
    segments = chat.transcript.segments()[: at + 1]
    spec = plot_slides.row_slide(row, texts, segments, "row", caption)
    assert [v["weight"] for v in _values(spec)] == list(figures.row_figure(row, texts, segments, "row").data[0].y)
    assert '"0 <|im_start|>"' in spec["encoding"]["x"]["axis"]["labelExpr"]  # ≤ 100 slots: tokens on the axis

    for spec in (growth, plot_slides.overview_slide(rows, lm.kv_heads, at, caption),
                 plot_slides.head_map_slide(weights, block, chat.transcript.boundaries(), "m", caption),
                 plot_slides.row_slide(row, texts, segments, "row", caption)):
        _check_renders(spec, caption)


def test_policy_run_slides_show_the_apps_numbers(lm, run):
    pieces = [slot.text for slot in run.turns[0].forced.session.transcript.slots]
    caption = plot_slides.run_caption(lm.name, run, 0)
    assert caption.startswith(f"{lm.name} · turn 1, {len(run.turns[0].steps)} decode steps · h2o, budget 20")

    kl = plot_slides.kl_slide(run, 0, caption)
    assert [v["kl"] for v in _values(kl)] == list(figures.kl_steps(run, 0).data[0].y)

    size = plot_slides.cache_size_slide(run, 0, caption)
    app = figures.cache_size(run, 0).data
    assert [v["slots"] for v in _values(size, 0) if v["segment"] == "generated"] == list(app[2].y)
    assert [v["slots"] for v in _values(size, 1) if v["series"] == "budget"] == [20] * len(run.turns[0].records)

    for layer, kv_head in ((None, None), (2, 1)):
        spec = plot_slides.timeline_slide(run, pieces, 0, caption, layer, kv_head)
        figure = figures.timeline(run, pieces, 0, layer, kv_head)
        z = figure.data[0].z
        assert {(v["slot"], v["step"]): v["seen"] for v in _values(spec)} == {
            (s, t): float(z[s, t]) for s in range(z.shape[0]) for t in range(z.shape[1]) if not math.isnan(z[s, t])}
        assert figure.layout.title.text == spec["title"]["text"]  # the app's title names what it shows, as the slide
        # no overprinted slot labels: at most one per 14 px of the plot's height
        assert len(figure.layout.yaxis.tickvals) <= (figure.layout.height - 70) // 14 < z.shape[0]
    assert spec["title"]["text"].startswith("Eviction timeline of layer 2, KV head 1: ")
    assert spec["title"]["text"].endswith(" evicted from layer 2, KV head 1")

    bits = plot_slides.bit_widths_slide(run, pieces, 0, caption)
    z = figures.bit_widths(run, pieces, 0).data[0].z
    assert sorted({v["bits"] for v in _values(bits)}) == sorted({float(b) for b in z.ravel() if not math.isnan(b)}) == [2.0, 16.0]
    assert len(_values(bits)) == int((~np.isnan(z)).sum())

    for spec in (kl, size, plot_slides.timeline_slide(run, pieces, 0, caption), bits):
        _check_renders(spec, caption)


def test_the_channel_slide_shows_the_channel_views_numbers(chat):
    from kvviz.channels import channels
    from kvviz.figures.channel_maps import channel_map

    at = len(chat) - 1
    view = channels(chat, 18, 2, at)
    texts = [s.text for s in chat.transcript.slots[:at]]
    caption = plot_slides.caption(chat.lm.name, at, chat.commits.edit_at(at))
    spec = plot_slides.channel_slide(view.keys_pre.numpy(), texts, view.outliers, "keys before RoPE", caption)
    shown = channel_map(view.keys_pre, texts, "t", view.outliers).data[0].z  # the app's map, slot by slot
    cells = {(v["slot"], v["channel"]): v["magnitude"] for v in _values(spec, 0)}
    assert cells == {(s, c): shown[s][c] for s in range(at) for c in range(chat.lm.head_dim)}
    assert [v["channel"] for v in _values(spec, 1)] == view.outliers and view.outliers
    _check_renders(spec, caption)


def test_the_channel_error_slide_shows_the_charts_numbers_with_the_fp4_blocks(chat):
    """At 4 bits the chart carries NVFP4's and MXFP4's per-block errors; the slide has the app figure's numbers, one
    line per quantizer in the same colours, and renders."""
    from kvviz.channels import channels
    from kvviz.figures.channel_maps import channel_errors

    at = len(chat) - 1
    view = channels(chat, 18, 2, at, 4)
    assert {"NVFP4", "MXFP4"} <= {name.split()[0] for name in view.errors}
    caption = plot_slides.caption(chat.lm.name, at, chat.commits.edit_at(at))
    spec = plot_slides.channel_errors_slide(view.key_peaks.numpy(), {k: v.numpy() for k, v in view.errors.items()},
                                            view.outliers, 4, "Key error per channel at 4 bits", caption)
    figure = channel_errors(view)
    assert [v["peak"] for v in _values(spec, 0)] == pytest.approx(list(figure.data[0].y))
    assert [v["channel"] for v in _values(spec, 0) if v["outlier"]] == view.outliers
    for trace, colour in zip(figure.data[1:], spec["layer"][1]["encoding"]["color"]["scale"]["range"]):
        line = [v["error"] for v in _values(spec, 1) if v["quantizer"] == trace.name]
        assert line == pytest.approx(list(trace.y)) and trace.line.color == colour
    _check_renders(spec, caption)
