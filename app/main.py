"""kvviz dashboard entry point: ``streamlit run app/main.py``. Layout only; every number comes from ``kvviz``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from kvviz import figures  # noqa: E402
from kvviz.errors import KvvizError  # noqa: E402
from kvviz.model import load_model  # noqa: E402
from kvviz.session import Session  # noqa: E402

st.set_page_config(page_title="kvviz — the KV cache, visible", layout="wide")


@st.cache_resource(show_spinner="Loading the model…")
def shared_model(path: str | None):
    """One model for all browser sessions (it holds no per-session state)."""
    return load_model(path)


try:
    lm = shared_model(os.environ.get("KVVIZ_MODEL"))
except KvvizError as exc:
    st.error(str(exc))
    st.stop()

if "session" not in st.session_state:
    st.session_state.session = Session(lm)
session: Session = st.session_state.session

with st.sidebar:
    st.caption(f"Model: {lm.name}")
    st.caption(f"Device: {lm.device_label}")
    max_new_tokens = st.slider("Max new tokens", 1, 256, 48)
    if st.button("New conversation"):
        st.session_state.session = session = Session(lm)

st.title("kvviz")
for turn in session.conversation():
    st.chat_message("user").text(turn["user"])
    st.chat_message("assistant").text(turn["assistant"])

if prompt := st.chat_input("Message the model"):
    st.chat_message("user").text(prompt)
    try:
        session.add_user_turn(prompt)
    except KvvizError as exc:
        st.warning(str(exc))
    else:
        placeholder = st.chat_message("assistant").empty()
        for _ in session.stream(max_new_tokens):
            placeholder.text(session.reply)  # plain text: model output is never rendered as Markdown/HTML
        st.rerun()

counts = session.transcript.counts()
st.subheader(f"Cache: {len(session)} slots — history {counts['history']}, query {counts['query']}, "
             f"generated {counts['generated']}")
if session.transcript.growth:
    st.plotly_chart(figures.growth(session.transcript))
    st.dataframe(session.transcript.rows(), hide_index=True, height=300)
