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
  // A request is carried out once per page, not once per element: a mark whose part of the page was not drawn for a
  // while (the what-if's charts under another tab, a tour card) comes back as a new element, and would otherwise
  // carry out its old request again and take the page from where the newest one put it
  const carried = (window.kvScrollCarried = window.kvScrollCarried || new Map());
  if (carried.get(data.place) === token) return;
  carried.set(data.place, token);
  // A chat page's main area sticks to its bottom while its content grows, also when charts draw after the run: keep
  // the mark at the top for 6 s and until the run is over and the page stopped growing, unless the person scrolls
  // meanwhile
  const host = parentElement.host || parentElement;
  const main = host.closest && host.closest("[data-testid=stAppScrollToBottomContainer]");
  const started = Date.now();
  // the newest request for a scroll area wins: an older watcher (the streamed reply's, still on the page while the
  // next run draws the strip) stops instead of pulling the page back to its own mark
  const area = main || host;
  const turn = (area.kvScrollTurn = (area.kvScrollTurn || 0) + 1);
  let stopped = false, height = -1, since = started, nudged = 0, held = null;
  // A person who scrolls (wheel, touch, keys) takes over. A click or a key elsewhere (a chip, a button, typing) holds
  // the page where it is instead of letting go: let go while the area still sticks to its bottom, the page would
  // fall there as the click's rerun redraws
  const scrolls = new Set(["ArrowUp", "ArrowDown", "PageUp", "PageDown", "Home", "End", " "]);
  const kinds = ["wheel", "touchstart", "keydown", "pointerdown"];
  const hold = (event) => {
    const editing = event.target && event.target.closest && event.target.closest("input, textarea, [contenteditable]");
    const scrolling = event.type === "wheel" || event.type === "touchstart" || event.target === main
      || (event.type === "keydown" && scrolls.has(event.key) && !editing);
    if (scrolling) { stopped = true; return; }
    held = mark.getBoundingClientRect().top;
  };
  for (const kind of kinds) window.addEventListener(kind, hold, { capture: true, passive: true });
  // the page's scroll state for whoever drives it (the browser tests): how many of these watchers still hold a place
  const root = document.documentElement;
  root.dataset.kvScrolling = String(Number(root.dataset.kvScrolling || 0) + 1);
  const done = () => {
    for (const kind of kinds) window.removeEventListener(kind, hold, { capture: true });
    root.dataset.kvScrolling = String(Number(root.dataset.kvScrolling) - 1);
  };
  const check = () => {
    if (stopped || mark.dataset.token !== token || area.kvScrollTurn !== turn) return done();
    const now = Date.now(), grown = main ? main.scrollHeight : 0;
    if (grown !== height) { height = grown; since = now; nudged = 0; }
    const top = mark.getBoundingClientRect().top;
    // held: only a pull to the bottom is undone (the container's stickiness); a scroll elsewhere was asked for
    const bottom = main && main.scrollHeight - main.scrollTop - main.clientHeight < 2;
    // a mark still below its place with the page scrolled to its end is as high as it can go (a short page, a
    // tall window): that is where it stays
    const away = held !== null ? bottom && Math.abs(top - held) > 2
      : data.top ? main && main.scrollTop > 0 : Math.abs(top - 72) > 40 && !(top > 72 && bottom);
    if (away) {
      nudged = 0;
      if (held !== null) { if (main) main.scrollTop += top - held; }  // where the person clicked
      else if (data.top) main.scrollTop = 0;  // the page's very top (its padding too)
      else mark.scrollIntoView({ block: "start" });
    }
    const app = document.querySelector("[data-testid=stApp]");
    const running = app && app.dataset.testScriptState === "running";
    // as long as the run that draws the place runs (a first run may load the model, a tour step run a policy: a
    // minute or more on a loaded CPU), and 2 s after the page last grew (charts draw after the run, late on a loaded
    // machine); at most 10 minutes
    const busy = running || now - since < 2000 || now - started < 6000;
    if (now - started > 600000) return done();
    if (!busy && !main) return done();  // in the sidebar: nothing there pulls the page to its bottom; the mark is in view
    if (!busy && main) {
      // Streamlit's container stops sticking to its bottom on a scroll that finds its size as the last scroll found
      // it; a scroll that is the first since the page grew keeps it stuck and it pulls the page down again. So:
      // nudge, and stop only once the place held for a second after the nudge (else bring it back, nudge again)
      if (!nudged) { main.scrollTop -= 1; nudged = now; }
      else if (now - nudged > 1000) return done();
    }
    setTimeout(check, 150);
  };
  setTimeout(check, 100);
}"""
_component = st.components.v2.component("kvviz_scroll_here", js=_JS)


def scroll_here(token: str, key: str, top: bool = False) -> None:
    """Mount the component; the page scrolls to it (``top``: to the page's very top) when ``token`` differs from the
    last one it saw."""
    _component(data={"token": token, "top": top, "place": key}, key=key, height=1)


PLACES = ("top", "strip", "charts", "views", "run", "blame", "branches")  # the page's title, the cache strip (with
# the what-if below it), the what-if's charts, the view tabs, a policy run's replies, its blame table, the branches


def look_at(place: str) -> None:
    """Bring ``place`` (:data:`PLACES`) to the top of the view on the next run, once: after a message or a demo the
    strip, for a tour step what it describes (Streamlit keeps a chat page at its bottom while it grows)."""
    state.look_at(place)


def mark(place: str) -> None:
    """Where the page scrolls for :func:`look_at` ``(place)``; the title's also when the page (re)loads."""
    count = state.scrolls(place)
    if count or place == "top":
        scroll_here(f"{place}-{count}", key=f"scroll-{place}", top=place == "top")
