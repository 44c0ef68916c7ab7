"""A page of the running app in headless Chromium, waited on through the states the page exposes: its console
watched, a message sent, an action settled, an option chosen; the mark that skips a browser test where Debian's
chromium is missing (never on CI).

Every wait is on a state, never on a pause: ``data-kv-runs`` on the document counts the runs of the page and of its
fragments that have finished (app/components/settled.py), Streamlit's ``data-test-script-state`` on the app says
whether one runs now, and ``data-kv-scrolling`` counts the scroll marks still holding a place in view
(app/components/scroll.py). A click's rerun can start seconds after the click on a loaded machine: reading the page
when nothing runs *yet* read the old page; waiting for a run that finished after the click does not."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.browser import CHROMIUM

needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                                    reason="Debian's chromium is not installed (scripts/test.sh installs it)")

RUNS = "Number(document.documentElement.dataset.kvRuns || 0)"
QUIET = ("(document.querySelector('[data-testid=stApp]')?.dataset.testScriptState !== 'running'"
         " && !document.querySelector('[data-testid=stStatusWidget]'))")
STILL = "Number(document.documentElement.dataset.kvScrolling || 0) === 0"
WAIT_MS = 300_000  # a bound on a wait for a state on a loaded machine, not a timing check (none asserts how fast)


def shows_evicted(chip, slot: int) -> None:
    """``chip`` (a locator) as the strip's one front end (kvviz/figures/strip.js) draws an evicted slot, whichever host
    drew it — the app, the notebook widget or the offline page: the same classes and the same label."""
    from playwright.sync_api import expect

    expect(chip).to_have_class(re.compile(r"^kv-chip kv-(history|query|generated) kv-evicted\b"), timeout=WAIT_MS)
    expect(chip).to_have_attribute("title", re.compile(
        rf"^slot {slot} · (history|query|generated) · turn \d+ · attention \d\.\d{{3}} of max · trying: evicted"))


def watch_console(page) -> None:
    """Collect the page's console warnings and errors in ``page.console`` (a test asserts it stays empty)."""
    page.console = []
    page.on("console", lambda m: page.console.append(f"{m.type}: {m.text}") if m.type in ("warning", "error")
            else None)


def runs(page) -> int:
    """How many runs of the page and of its fragments this browser session has finished."""
    return page.evaluate(RUNS)


SEEN = ("JSON.stringify({runs: " + RUNS + ", script: document.querySelector('[data-testid=stApp]')?.dataset"
        ".testScriptState, status: !!document.querySelector('[data-testid=stStatusWidget]'), scrolling: "
        "document.documentElement.dataset.kvScrolling, errors: [...document.querySelectorAll("
        "'[data-testid=stException], [data-testid=stAlertContentError]')].map(e => e.innerText.slice(0, 300))})")


def wait_for(page, state: str) -> None:
    """Until the JavaScript condition ``state`` holds. One that never does fails with what the page shows then — its
    run count, whether a script runs, the status widget, the scroll marks and any exception or error on it — so a
    failure on a machine no one watched explains itself."""
    try:
        page.wait_for_function(state, timeout=WAIT_MS)
    except Exception as exc:  # playwright's TimeoutError, or the page gone
        try:
            seen = page.evaluate(SEEN)
        except Exception:  # noqa: BLE001 — the page itself may be what failed
            seen = "(the page could not be read)"
        raise AssertionError(f"waited {WAIT_MS / 1000:.0f} s for {state}; the page: {seen}") from exc


def idle(page) -> None:
    """Until the page has finished a run and none runs now (for a page just opened, or after work that was waited
    on through its own result)."""
    wait_for(page, f"{RUNS} > 0 && {QUIET}")


def settle(page, action: Callable[[], object], during_run: bool = False) -> None:
    """Do ``action`` (a click, a key, a fill) once no run is going on, and return once a run that finished after it
    was done and none runs. The first wait matters: a click sent while a run is under way can be lost on a busy machine
    (the session upload's *Load it* met this), and then the run it should start never comes. ``during_run``: the
    action is meant for a run under way (its *Stop*), done at once."""
    if not during_run:
        wait_for(page, QUIET)
    before = runs(page)
    action()
    wait_for(page, f"{RUNS} > {before} && {QUIET}")


def still(page) -> None:
    """Until nothing runs and no scroll mark still holds a place: where the page is now is where it stays."""
    wait_for(page, f"{RUNS} > 0 && {QUIET} && {STILL}")


def click_when_still(page, target, **options) -> None:
    """Click ``target`` once the page has stopped moving under it and return once the click's rerun is over.
    Streamlit sticks a chat page to its bottom while charts still draw, so an element scrolled into view can leave it
    before the click lands; such a click is tried again after the page settles."""
    from playwright.sync_api import Error

    for attempt in range(4):
        target.scroll_into_view_if_needed()
        still(page)
        try:
            settle(page, lambda: target.click(**options))
            return
        except Error as error:
            if "outside of the viewport" not in str(error) or attempt == 3:
                raise


def choose(page, select, option: str, reruns: bool = True) -> None:
    """Pick ``option`` in the Streamlit selectbox ``select``: typed to filter the menu, then the option itself clicked
    (Enter picks whichever option is highlighted — on a loaded machine the old choice, or none while the menu is still
    closed — and the input shows the typed text either way); returns once the choice's rerun is over (``reruns``:
    False for a selectbox inside a form, whose choice waits for the form's button), or else once the menu has closed. A
    rerun that redraws the menu under the click (the option detached, the menu closed) is met by choosing again."""
    from playwright.sync_api import TimeoutError as Timeout

    for attempt in range(3):
        idle(page)
        select.click()
        page.keyboard.press("Control+a")  # a retry replaces what the last one typed
        page.keyboard.type(option)
        pick = page.get_by_role("option", name=option, exact=True)
        try:
            if reruns:
                settle(page, lambda: pick.click(timeout=20_000))
            else:
                pick.click(timeout=20_000)
                page.get_by_role("listbox").wait_for(state="detached", timeout=20_000)
        except Timeout:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")
            continue
        return


def send(page, text: str) -> None:
    """Send ``text`` as a message and return once the reply, the strip and the what-if's numbers are drawn."""
    page.fill("[data-testid=stChatInputTextArea]", text)
    settle(page, lambda: page.keyboard.press("Enter"))
    page.wait_for_selector(".kv-chip", timeout=WAIT_MS)
    page.wait_for_function("document.querySelectorAll('[data-testid=stMetric]').length >= 5", timeout=WAIT_MS)
    idle(page)
    page.mouse.wheel(0, 1)  # as a person who takes over: the page stops holding the strip in view


def in_view(page, target) -> bool:
    """Whether ``target`` (a locator) starts on screen: its top inside the viewport, below Streamlit's header bar and
    above the chat box fixed at the bottom (which covers what is under it)."""
    box = target.bounding_box()
    chat = page.locator("[data-testid=stChatInput]").bounding_box()
    bottom = chat["y"] if chat else page.viewport_size["height"]
    return box is not None and 48 <= box["y"] < bottom - 16
