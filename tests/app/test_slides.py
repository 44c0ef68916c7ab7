"""Every figure's "For a slide" download in the app, run as the browser would run it (Streamlit builds the file when
the button is pressed): each gives a valid PNG or SVG captioned with the model, the step and the edit."""

from __future__ import annotations

import struct

import pytest
from streamlit.runtime.media_file_manager import MediaFileManager

from tests.support.app_test import assert_clean, open_view, start


@pytest.fixture
def made(monkeypatch) -> dict:
    """The deferred file builders the app registers, by file name (AppTest cannot press a download button)."""
    builders: dict = {}
    original = MediaFileManager.add_deferred

    def record(self, data_callable, mimetype, coordinates, file_name=None, **kwargs):
        builders[file_name] = data_callable
        return original(self, data_callable, mimetype, coordinates, file_name, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add_deferred", record)
    return builders


def _png_width(png: bytes) -> int:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", png[16:20])[0]


def test_attention_growth_and_whatif_figures_download_for_a_slide(made):
    app = start()
    app.chat_input[0].set_value("Name two colours.").run()
    app.session_state["draft"].toggle_evicted(5)
    app.run()
    assert_clean(app)
    at, name = len(app.session_state["session"]) - 1, app.session_state["session"].lm.name
    keys = {b.key for b in app.get("download_button")}
    open_view(app, "Cache growth")  # one tab is drawn at a time; the Attention tab's builders stay recorded
    keys |= {b.key for b in app.get("download_button")}
    assert {"overview-slide", "headmap-slide", "row-slide", "growth-slide"} <= keys
    files = {f"kvviz-overview-slot{at}.png", "kvviz-map-l0h0.png", f"kvviz-row-slot{at}-l0h0.png",
             f"kvviz-growth-{at + 1}.png", f"kvviz-strip-slot{at}.png"}
    assert files <= set(made), sorted(made)
    for file in files:
        assert 600 <= _png_width(made[file]()) <= 1920, file
    app.radio(key="growth-slide-format").set_value("SVG").run()
    svg = made[f"kvviz-growth-{at + 1}.svg"]()
    assert svg.startswith("<svg") and name.split(" ")[0] in svg and f"step {at} · " in svg


def test_policy_run_figures_download_for_a_slide(made):
    app = start()
    app.chat_input[0].set_value("Name three cats.").run()
    open_view(app, "Policy run")
    app.checkbox[[c.label for c in app.checkbox].index("KIVI quantization")].check()
    app.number_input[[n.label for n in app.number_input].index("New tokens per turn")].set_value(6)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    stems = ["kvviz-run-turn1-kl", "kvviz-run-turn1-size", "kvviz-run-turn1-timeline", "kvviz-run-turn1-bits"]
    for stem in stems:
        png = made[f"{stem}.png"]()
        assert 600 <= _png_width(png) <= 1920, stem
