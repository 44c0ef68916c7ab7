"""Rendering a slide makes no request (a remote data URL is refused)."""

from __future__ import annotations

import pytest

from kvviz.figures import slides


def test_rendering_makes_no_request():
    spec = {"data": {"url": "http://example.com/data.csv"}, "mark": "point"}
    with pytest.raises(ValueError, match="External data url not allowed"):
        slides.to_png(spec)
