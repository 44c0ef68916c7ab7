"""A page of the running app in headless Chromium: its console watched, waits until it is idle, a message sent; the
mark that skips a browser test where Debian's chromium is missing (never on CI)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks.browser import CHROMIUM

needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                                    reason="Debian's chromium is not installed (scripts/test.sh installs it)")


def watch_console(page) -> None:
    """Collect the page's console warnings and errors in ``page.console`` (a test asserts it stays empty)."""
    page.console = []
    page.on("console", lambda m: page.console.append(f"{m.type}: {m.text}") if m.type in ("warning", "error")
            else None)


def idle(page, seconds: float = 1.0) -> None:
    """Until no rerun runs, and none has started ``seconds`` later (on a loaded machine a rerun can show late)."""
    for _ in range(30):
        page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=300_000)
        page.wait_for_timeout(seconds * 1000)
        if not page.locator("[data-testid=stStatusWidget]").count():
            return


def click_when_still(page, target, **options) -> None:
    """Click ``target`` once the page has stopped moving under it. Streamlit sticks a chat page to its bottom while
    charts still draw (late on a loaded machine), so an element scrolled into view can leave it before the click
    lands; such a click is tried again after the page settles."""
    from playwright.sync_api import Error

    for attempt in range(4):
        target.scroll_into_view_if_needed()
        idle(page)
        try:
            target.click(**options)
            return
        except Error as error:
            if "outside of the viewport" not in str(error) or attempt == 3:
                raise


def choose(page, select, option: str) -> None:
    """Pick ``option`` in the Streamlit selectbox ``select``: typed to filter the menu, then the option itself clicked
    (Enter picks whichever option is highlighted — on a loaded machine the old choice, or none while the menu is still
    closed — and the input shows the typed text either way); returns once the choice's rerun is over. A rerun that
    redraws the menu under the click (the option detached, the menu closed) is met by choosing again."""
    from playwright.sync_api import TimeoutError as Timeout

    for attempt in range(3):
        idle(page)
        select.click()
        page.keyboard.press("Control+a")  # a retry replaces what the last one typed
        page.keyboard.type(option)
        try:
            page.get_by_role("option", name=option, exact=True).click(timeout=20_000)
        except Timeout:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")
            continue
        idle(page, 2)
        return


def send(page, text: str) -> None:
    page.fill("[data-testid=stChatInputTextArea]", text)
    page.keyboard.press("Enter")
    page.wait_for_selector(".kv-chip", timeout=300_000)
    page.wait_for_function("document.querySelectorAll('[data-testid=stMetric]').length >= 5", timeout=300_000)
    idle(page)
    page.mouse.wheel(0, 1)  # as a person who takes over: the page stops holding the strip in view


def holds(page, condition, seconds: float = 120, still: float = 2.0):
    """Wait until ``condition()`` (a Python check of the page) is true and stays true for ``still`` seconds, up to
    ``seconds``; return its last value (a test asserts on it, so a page that never settles fails with what it showed).
    A page scrolls itself after a run (app/components/scroll.py) and charts draw late on a loaded machine: a fixed
    pause is either too long or, under load, too short."""
    deadline, since, value = time.monotonic() + seconds, None, None
    while time.monotonic() < deadline:
        value = condition()
        if value:
            since = since or time.monotonic()
            if time.monotonic() - since >= still:
                return value
        else:
            since = None
        page.wait_for_timeout(250)
    return value
