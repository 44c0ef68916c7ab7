"""The cache strip's one front end (``strip.js`` and ``strip.css`` beside this file): every host that draws the strip
loads the same script and style sheet — the dashboard's Streamlit component, the notebook widget (anywidget) and the
offline page — and feeds it the same rows, :func:`kvviz.view_data.strip_chips`'. A host adds its own few lines after
the script (how it receives rows and where a click goes): :func:`front_end` joins them, so a chip's classes, badges and
tooltip are written once."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_HERE = Path(__file__).parent


@cache
def strip_css() -> str:
    """The strip's style sheet."""
    return (_HERE / "strip.css").read_text(encoding="utf-8")


@cache
def _strip_js() -> str:
    return (_HERE / "strip.js").read_text(encoding="utf-8")


def front_end(host: Path) -> str:
    """The strip's script followed by the host's own (``host``: its ``.js`` file), as one text to load."""
    return _strip_js() + "\n" + host.read_text(encoding="utf-8")
