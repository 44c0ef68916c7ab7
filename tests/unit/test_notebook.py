"""The widget's front end loads nothing from outside (no URL in the JavaScript and CSS the package ships)."""

from __future__ import annotations

import re

from kvviz.notebook import cache_widget as widget_module


def test_the_widget_front_end_loads_nothing_from_outside():
    for name in ("widget.js", "widget.css"):
        text = (widget_module._HERE / name).read_text()
        assert not re.search(r"https?://|//cdn|\bimport\s*\(|\bfrom\s+['\"]", text), name
