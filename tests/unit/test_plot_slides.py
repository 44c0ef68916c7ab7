"""Slide layout without a model: a long conversation keeps slot numbers on the axis, a caption breaks at its
separators."""

from __future__ import annotations

from kvviz.figures import plot_slides, slides


def test_a_long_conversation_keeps_slot_numbers_on_the_axis():
    spec = plot_slides.row_slide([0.01] * 300, ["t"] * 300, ["query"] * 300, "row", "c")
    assert spec["encoding"]["x"]["axis"] == {"title": "slot"}


def test_a_caption_is_broken_into_lines_at_its_separators():
    heading = slides.heading("T", " · ".join(["x" * 60] * 3))
    assert heading["subtitle"] == [f"{'x' * 60} · {'x' * 60}", "x" * 60]
