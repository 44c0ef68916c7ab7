"""Slides of the what-if (Vega-Lite): valid PNG (≤ 1920 px, twice at scale 2) and SVG that fit a slide, boxes as wide
as their text, the what-if's numbers, token text quoted as a valid Vega string."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET

import pytest

from kvviz.edit.draft import EditDraft
from kvviz.figures import alpha_chart, slides
from kvviz.session import Session
from kvviz.view_data import strip_chips
from kvviz.whatif import what_if


@pytest.fixture(scope="module")
def prepared(lm):
    session = Session(lm)
    session.add_user_turn("It's a \"quoted\" test \\ with a back'slash. Name a planet.")
    session.generate(16)
    at = len(session) - 1
    draft = EditDraft()
    for slot in (10, 11, 12):
        draft.toggle_evicted(slot)
    result = what_if(session, draft.edit(at), layer=3, head=2)
    return session, result, strip_chips(session, draft, at, 3, None)


def _size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


def _fills_a_slide(width: int, height: int) -> bool:
    """"PNG, 1920 px" fills a 1920×1080 slide, legends included: as wide as it, or as high (a tall figure)."""
    return width <= slides.WIDTH and height <= slides.HEIGHT and (width == slides.WIDTH or height == slides.HEIGHT)


def test_every_slide_is_a_valid_png_and_svg_that_fits_a_slide(prepared):
    session, result, chips = prepared
    specs = slides.whatif_slides(result, chips, session.lm.name)
    assert set(specs) == {"strip", "next-token tables", "attention weights (α, α′)", "ρ and Δo maps",
                          "hidden-state change"}
    for name, spec in specs.items():
        width, height = _size(slides.to_png(spec))
        assert _fills_a_slide(width, height), name
        double = _size(slides.to_png(spec, scale=2))
        assert abs(double[0] - 2 * width) <= 1 and abs(double[1] - 2 * height) <= 1, name  # each side floored
        svg = ET.fromstring(slides.to_svg(spec))
        natural = float(svg.get("width")), float(svg.get("height"))  # the SVG at Vega's own size, same proportions
        assert svg.tag.endswith("svg") and 600 <= natural[0] and height == pytest.approx(
            natural[1] * width / natural[0], abs=1), name
        text = " ".join(t for t in svg.itertext())
        assert f"step {result.at} · " in text and "evict 3 slots (10, 11, 12)" in text, name


def test_the_strip_slide_draws_each_box_as_wide_as_its_text(prepared):
    """A box spans its text and one character; a character of the monospaced font is 0.602 em wide (DejaVu Sans
    Mono), so the x scale may give it at most 10 % more than that (it gave 2.3× when the lines held 96 characters)."""
    session, result, chips = prepared
    spec = slides.strip_slide(chips, "caption")
    per_char = spec["width"] / spec["layer"][0]["encoding"]["x"]["scale"]["domain"][1]
    assert 0.602 * slides.STRIP_FONT <= per_char <= 1.1 * 0.602 * slides.STRIP_FONT
    rows = spec["data"]["values"]
    assert [r["text"] for r in rows] == [c[1][:24] for c in chips]  # spelled once, by the strip's own rows
    assert all(r["x2"] - r["x"] == pytest.approx(len(r["text"]) + 0.7) for r in rows)


def test_slides_hold_the_what_ifs_numbers(prepared):
    session, result, chips = prepared
    specs = slides.whatif_slides(result, chips, session.lm.name)
    tables = specs["next-token tables"]
    full = [row["p"] for row in tables["data"]["values"] if row["side"] == "full cache"]
    assert full == [c.prob for c in result.next_token.full]
    assert f"KL {result.next_token.kl:.3g} nats" in tables["title"]["text"]
    strip = specs["strip"]["data"]["values"]
    assert [row["evicted"] for row in strip] == [chip[0] in (10, 11, 12) for chip in chips]
    assert [row["attention"] for row in strip] == [chip[4] for chip in chips]


def test_the_alpha_axis_names_tokens_up_to_100_slots_and_quotes_any_text(prepared):
    session, result, chips = prepared
    texts = [chip[1] for chip in chips]
    spec = slides.alpha_slide(alpha_chart(result.detail, texts), "caption")
    expression = spec["layer"][0]["encoding"]["x"]["axis"]["labelExpr"]
    assert 'datum.value == 0 ? "0 ' in expression and '\\"' in expression  # JSON string literals, quotes escaped
    width, _ = _size(slides.to_png(spec))  # renders: the expression parses
    assert width <= slides.WIDTH
    long = alpha_chart(result.detail.__class__(0, 0, list(range(300)), [1 / 300] * 300, [1 / 300] * 300,
                                               [1 / 300] * 300), ["t"] * 300)
    assert "axis" not in slides.alpha_slide(long, "caption")["layer"][0]["encoding"]["x"]


def test_any_token_text_is_a_valid_vega_string(prepared):
    session, result, chips = prepared
    texts = ["a\rb", "c\u2028d", "e\u2029f", "it's", 'say "x"', "back\\slash", "new\nline"] + ["t"] * 50
    detail = result.detail.__class__(0, 0, list(range(len(texts))), [1 / len(texts)] * len(texts),
                                     [1 / len(texts)] * len(texts), [1 / len(texts)] * len(texts))
    spec = slides.alpha_slide(alpha_chart(detail, texts), "caption")
    assert _size(slides.to_png(spec))[0] <= slides.WIDTH  # the label expression parses
