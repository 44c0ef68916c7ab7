"""The app under Streamlit's AppTest: start the page, open a view, read a metric, check it is clean."""

from __future__ import annotations

import json
from pathlib import Path
from streamlit.testing.v1 import AppTest


APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


def start() -> AppTest:
    app = AppTest.from_file(APP, default_timeout=300).run()
    assert not app.exception
    return app


def assert_clean(app: AppTest) -> None:
    assert not app.exception, app.exception
    assert not [e.value for e in app.error], [e.value for e in app.error]


def open_view(app: AppTest, label: str) -> AppTest:
    """Choose one of the page's view tabs (only the open one is drawn) and rerun."""
    app.session_state["view"] = label
    return app.run()


def policy_run_without_a_policy(prompt: str) -> AppTest:
    """A page that answered ``prompt``, on its Policy run tab with no policy chosen (a cache format or a reader
    alone)."""
    app = start()
    app.chat_input[0].set_value(prompt).run()
    open_view(app, "Policy run")
    next(s for s in app.selectbox if s.label == "Policy").select("(none: a quantized cache only)")
    return app


def strip_data(app: AppTest) -> dict:
    """What the strip component was sent (the page's other components, e.g. its scroll marks, are skipped)."""
    sent = [c.proto.bytes for c in app.get("bidi_component")]
    return next(data for data in (json.loads(b) for b in sent if b) if "chips" in data)


def metric(app: AppTest, label: str) -> str:
    return next(m.value for m in app.metric if m.label.startswith(label))
