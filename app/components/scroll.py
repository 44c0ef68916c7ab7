"""A one-line component that scrolls the page so that it sits at the top of the view, once per ``token`` (e.g. each
step of a tour): a speaker's next step is always on screen, however far down the page was (Streamlit keeps a chat
page scrolled to its bottom while it grows)."""

from __future__ import annotations

import streamlit as st

_JS = """export default function ({ parentElement, data }) {
  const token = data ? String(data.token) : "";
  let mark = parentElement.querySelector(".kv-scroll");  // parentElement is a shadow root: a mark of our own
  if (!mark) {
    mark = document.createElement("div");
    mark.className = "kv-scroll";
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
  let stopped = false, height = -1, since = started;
  const stop = () => { stopped = true; };
  for (const kind of ["wheel", "touchstart", "keydown", "pointerdown"]) {
    window.addEventListener(kind, stop, { once: true, capture: true });
  }
  const check = () => {
    if (stopped || mark.dataset.token !== token) return;
    const now = Date.now(), grown = main ? main.scrollHeight : 0;
    if (grown !== height) { height = grown; since = now; }
    if (Math.abs(mark.getBoundingClientRect().top) > 40) mark.scrollIntoView({ block: "start" });
    const app = document.querySelector("[data-testid=stApp]");
    const running = app && app.dataset.testScriptState === "running";
    const watching = running || now - since < 700 || now - started < 6000;  // charts draw after the run is over
    if (watching && now - started < 20000) setTimeout(check, 150);
    else if (main) main.scrollTop -= 1;  // a scroll while nothing grows: Streamlit stops sticking to the bottom
  };
  setTimeout(check, 100);
}"""
_component = st.components.v2.component("kvviz_scroll_here", js=_JS)


def scroll_here(token: str, key: str) -> None:
    """Mount the component; the page scrolls to it when ``token`` differs from the last one it saw."""
    _component(data={"token": token}, key=key, height=1)
