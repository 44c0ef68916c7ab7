"""Hostile files, third round (issue #61), in the page: a prompt file uploaded to the Sweeps tab that is not UTF-8,
is nested too deeply or holds a 5,000-digit integer is refused in one warning naming file and line — the whole view
was replaced by "could not be drawn". The crafted files are those of ``tests/unit/hostile/``."""

from __future__ import annotations

from pathlib import Path

import pytest

HOSTILE = Path(__file__).resolve().parents[1] / "unit" / "hostile"


def _form() -> None:
    """The Sweeps form handed an upload of the file ``session_state["hostile"]`` names (AppTest cannot fill a file
    uploader)."""
    from pathlib import Path
    from types import SimpleNamespace

    import streamlit as st

    from app.views import sweep_form

    path = Path(st.session_state["hostile"])
    upload = SimpleNamespace(name=path.name, getvalue=path.read_bytes)
    sweep_form._start(sweep_form.UPLOAD, upload, 2, ["h2o"], [0.5], "decode", 8, {}, [sweep_form.CACHES[0]])
    st.write("the page goes on")


@pytest.mark.parametrize("name, words", [
    ("latin1.jsonl", "latin1.jsonl:1: not UTF-8 text"), ("utf16.jsonl", "utf16.jsonl:1: not UTF-8 text"),
    ("deep.jsonl", "deep.jsonl:1: nested too deeply"),
    ("huge_integer.jsonl", "huge_integer.jsonl:1: holds a number of more than 4,300 digits")])
def test_a_hostile_upload_is_one_warning_and_the_page_goes_on(name, words):
    from streamlit.testing.v1 import AppTest

    app = AppTest.from_function(_form, default_timeout=120)
    app.session_state["hostile"] = str(HOSTILE / name)
    app.run()
    assert not app.exception
    said = [w.value.replace("\\", "") for w in app.warning]  # as Markdown escaped it
    assert len(said) == 1 and words in said[0], said
    assert [m.value for m in app.markdown][-1] == "the page goes on"
