"""A one-line component that scrolls the page so that it sits at the top of the view, once per ``token`` (each step
of a tour, the strip after a message or a demo, the title when the page opens): what the person is about to look at
is on screen, however far down the page was (Streamlit keeps a chat page scrolled to its bottom while it grows)."""

from __future__ import annotations

import streamlit as st

from app import state

_JS = """export default function ({ parentElement, data }) {
  const token = data ? String(data.token) : "";
  let mark = parentElement.querySelector(".kv-scroll");  // parentElement is a shadow root: a mark of our own
  if (!mark) {
    mark = document.createElement("div");
    mark.className = "kv-scroll";
    mark.style.scrollMarginTop = "4.5rem";  // below Streamlit's header bar, which covers the view's top
    parentElement.appendChild(mark);
  }
  if (mark.dataset.token === token) return;
  mark.dataset.token = token;
  // A chat page's main area sticks to its bottom while its content grows, also when charts draw after the run: keep
  // the mark at the top for 6 s and until the run is over and the page stopped growing, unless the person scrolls,
  // clicks or types meanwhile
  const host = parentElement.host || parentElement;
  const main = host.closest && host.closest("[data-testid=stAppScrollToBottomContainer]");
  const started = Date.now();
  // the newest request for a scroll area wins: an older watcher (the streamed reply's, still on the page while the
  // next run draws the strip) stops instead of pulling the page back to its own mark
  const area = main || host;
  const turn = (area.kvScrollTurn = (area.kvScrollTurn || 0) + 1);
  let stopped = false, height = -1, since = started;
  const stop = () => { stopped = true; };
  for (const kind of ["wheel", "touchstart", "keydown", "pointerdown"]) {
    window.addEventListener(kind, stop, { once: true, capture: true });
  }
  const check = () => {
    if (stopped || mark.dataset.token !== token || area.kvScrollTurn !== turn) return;
    const top = mark.getBoundingClientRect().top;
    const now = Date.now(), grown = main ? main.scrollHeight : 0;
    if (grown !== height) { height = grown; since = now; }
    if (data.top) { if (main && main.scrollTop > 0) main.scrollTop = 0; }  // the page's very top (its padding too)
    else if (Math.abs(top - 72) > 40) mark.scrollIntoView({ block: "start" });
    const app = document.querySelector("[data-testid=stApp]");
    const running = app && app.dataset.testScriptState === "running";
    const watching = running || now - since < 2000 || now - started < 6000;  // charts draw after the run is over (late on a loaded machine)
    // as long as the run that draws the place runs (a first run may load the model, a tour step run a policy: a
    // minute or more on a loaded CPU), at most 10 minutes
    if (watching && now - started < 600000) setTimeout(check, 150);
    else if (main) main.scrollTop -= 1;  // a scroll while nothing grows: Streamlit stops sticking to the bottom
  };
  setTimeout(check, 100);
}"""
_component = st.components.v2.component("kvviz_scroll_here", js=_JS)


def scroll_here(token: str, key: str, top: bool = False) -> None:
    """Mount the component; the page scrolls to it (``top``: to the page's very top) when ``token`` differs from the
    last one it saw."""
    _component(data={"token": token, "top": top}, key=key, height=1)


PLACES = ("top", "strip", "views", "run", "blame")  # the page's title, the cache strip (with the what-if below it), the
# view tabs, a policy run's replies and its blame table


def look_at(place: str) -> None:
    """Bring ``place`` (:data:`PLACES`) to the top of the view on the next run, once: after a message or a demo the
    strip, for a tour step what it describes (Streamlit keeps a chat page at its bottom while it grows)."""
    state.look_at(place)


def mark(place: str) -> None:
    """Where the page scrolls for :func:`look_at` ``(place)``; the title's also when the page (re)loads."""
    count = state.scrolls(place)
    if count or place == "top":
        scroll_here(f"{place}-{count}", key=f"scroll-{place}", top=place == "top")
