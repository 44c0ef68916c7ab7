"""kvviz dashboard: ``streamlit run app/main.py``. Layout only; every number comes from ``kvviz``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
# The page's server shares the CPU with the browser (often on the same laptop): idle OpenMP threads must sleep, not
# spin. Measured on 2 cores: a click's what-if ran ~1.5x faster. Set before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from app import housekeeping, launch, long_work, persistence, server_memory, state  # noqa: E402
from app.components.scroll import mark  # noqa: E402
from app.components.settled import hide, settled  # noqa: E402
from app.plain import plain, warn  # noqa: E402
from app.views import (attention, channels, chat, growth, guide, held, policies, policy_run, sidebar, sweeps,  # noqa: E402
                       token_strip, tour, toy, whatif)
from kvviz import settings  # noqa: E402
from kvviz.errors import KvvizError  # noqa: E402
from kvviz.model import load_model  # noqa: E402

st.set_page_config(page_title="kvviz — the KV cache, visible", layout="wide")
if problem := launch.refusal(st.get_option("server.address"), st.context.headers.get("Host")):
    st.error(plain(problem))
    st.stop()


@st.cache_resource(show_spinner="Loading the model…")
def shared_model(path: str | None):
    """One model for all browser sessions (it holds no per-session state)."""
    return load_model(path)


@st.cache_resource
def shared_memory(path: str | None) -> server_memory.ServerMemory:
    """The memory budget of all browser sessions on this model, and the thread that keeps it."""
    memory = server_memory.create(shared_model(path))
    housekeeping.start(memory)
    return memory


def guarded(view) -> None:
    """Render a view (a module's ``render``, or a function); an unexpected error becomes one line, never a
    traceback."""
    try:
        getattr(view, "render", view)()
    except KvvizError as exc:
        warn(exc)
    except Exception as exc:  # noqa: BLE001 — the page must stay up in front of an audience
        warn(f"The {view.__name__.rsplit('.', 1)[-1]} view could not be drawn ({type(exc).__name__}: {exc}); "
             "the session is unchanged.")


try:
    settings.check()
    model_path = state.model_path() or settings.text("KVVIZ_MODEL")
    lm, memory = shared_model(model_path), shared_memory(model_path)
except KvvizError as exc:
    state.choose_model(None)  # a bad path chosen in the page: back to the default next run
    warn(exc)
    st.stop()

housekeeping.touch()
persistence.init(lm, memory)
guarded(sidebar)
if st.session_state.large:  # every element scales: prose, widgets, numbers, tables (charts get larger fonts as well)
    st.html("<style>html, .stMarkdown, .stText, p, code, label {font-size: 1.3rem !important;}"
            "[data-testid=stMetricValue], [data-testid=stMetricValue] * {font-size: 2.1rem !important;}"
            "[data-testid=stMetricLabel] p, [data-testid=stMetricDelta] {font-size: 1rem !important;}"
            "[data-testid=stTable] p {font-size: 1.1rem !important; white-space: nowrap; margin: 0 !important;"
            " line-height: 1.3;}"
            "[data-testid=stTable] td, [data-testid=stTable] th {padding: 0.1rem 0.45rem !important;"
            " white-space: nowrap;}</style>")

hide()
mark("top")  # a page (re)load opens at its title, not at the bottom where Streamlit keeps a chat page
st.title("kvviz — the KV cache, visible")
guarded(held)
guarded(guide)
guarded(toy)
guarded(chat)
st.subheader(f"Cache: {len(state.session())} slots")
if not st.session_state.large:
    mark("strip")  # after a message, a demo or a tour step about it: the strip and the what-if come into view, once
guarded(token_strip.view_settings)
if st.session_state.large:  # a projector: the numbers and the strip below them fill the screen above the chat box
    mark("strip")


@st.fragment
def editor() -> None:
    """The strip and the what-if: a click reruns only this part of the page (the edit touches nothing else). Its
    save is also the page's: nothing drawn after it changes the session or the draft without a rerun. The what-if
    is computed before anything is drawn (see ``whatif.prepare``), and its numbers are sent before the strip that
    stands above them (see ``whatif.summary``)."""
    persistence.begin_run()  # a click reruns only this fragment (or the page, when it chose a head): in use until its end
    if notice := state.take_notice():  # e.g. a refused click, noted by its callback just before this run
        message, note = notice
        if note:
            st.info(plain(message))
        else:
            warn(message)
    guarded(whatif.prepare)
    large = st.session_state.large  # presentation mode: the numbers above the strip, the tables right below it
    first, second = st.container(), st.container()
    numbers, strip = (first, second) if large else (second, first)
    with numbers:
        guarded(whatif.summary)
    # Let the server's event loop send the numbers now: the drawing below holds the GIL, and the loop then sent them
    # only when the run ended. Measured at 1k slots, pointerdown → numbers on the page: 240–247 → 182–226 ms.
    time.sleep(0.01)
    with strip:
        guarded(token_strip)
    if large:
        guarded(whatif.tables)
        guarded(token_strip.controls)
        guarded(whatif.rest)
    else:
        guarded(whatif)
    persistence.save()
    persistence.end_run()
    settled("editor")


VIEWS = {"Attention": attention, "Cache growth": growth, "Channels": channels, "Policies": policies, "Policy run": policy_run,
         "Sweeps": sweeps}


@st.fragment
def views() -> None:
    """The views below the editor, as tabs of which only the open one is drawn. During a click's run the browser
    re-renders every tab panel many times, and each render walks a hidden panel's nodes to their end (looking for a
    focusable one): at 8k slots, with the Attention view hidden behind another tab, a click settled ~0.17 s later.
    Choosing a tab, or a view's own widget, reruns only this part; what changes the whole page (a head picked on the
    overview) reruns it."""
    persistence.begin_run()
    state.take_open_view()  # a view opened another (before the tabs are drawn)
    tabs = st.tabs(list(VIEWS), key="view", on_change="rerun")
    for tab, view in zip(tabs, VIEWS.values()):
        if tab.open:
            with tab:
                guarded(view)
    persistence.end_run()
    settled("views")


editor()
mark("views")  # a tour step about a view tab
views()
guarded(tour.render)  # a tour's card, last: docked at the bottom of the view, in the chat box's place
long_work.run_pending()  # a policy run asked for in the views: here, where Stop can interrupt it
persistence.end_run()
settled("page")
