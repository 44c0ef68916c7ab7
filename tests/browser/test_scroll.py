"""The page stays where the person looks, in a real headless Chromium at 1500×1000 and 1280×720: it opens at its title
(Streamlit keeps a chat page at its bottom, which once opened it 563–917 px down), a message and a demo bring the
cache strip into view (they once left the page at the attention charts far below), and a click on a chip — after
*Jump to* too — leaves the page where it was."""

from __future__ import annotations

import pytest

from tests.support.browser_page import idle, settle, still, watch_console


SCROLLED = "document.querySelector('[data-testid=stAppScrollToBottomContainer]').scrollTop"


def _strip_in_view(page, height: int) -> float:
    """The page's scroll offset once nothing runs and no scroll mark holds a place any more (charts still draw after
    a run on a loaded machine, and the page holds its place meanwhile), with the strip's first row on screen and room
    below it for the strip itself."""
    still(page)
    top = page.locator(".kv-chip").first.bounding_box()["y"]
    assert 0 <= top <= height - 200, f"the strip is at {top:.0f} px of a {height} px view"
    return page.evaluate(SCROLLED)


def _stays(page, before: float) -> None:
    """The page, settled, is where it was before a click (±2 px): a click edits, the page does not move."""
    still(page)
    assert abs(page.evaluate(SCROLLED) - before) <= 2, f"the page moved from {before} to {page.evaluate(SCROLLED)}"


@pytest.mark.parametrize("width,height", [(1500, 1000), (1280, 720)])
def test_the_page_stays_where_the_person_looks(server, width, height):
    from benchmarks.browser import browser_page

    with browser_page(server, width=width, height=height) as page:
        watch_console(page)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        idle(page)
        still(page)
        assert page.evaluate(SCROLLED) == 0  # opens at its title
        assert 0 <= page.get_by_role("heading", name="kvviz — the KV cache, visible").bounding_box()["y"] < 200

        page.fill("[data-testid=stChatInputTextArea]", "My cat is called Whiskers. What is my cat called?")
        settle(page, lambda: page.keyboard.press("Enter"))
        page.wait_for_selector(".kv-chip", timeout=300_000)
        before = _strip_in_view(page, height)
        settle(page, lambda: page.locator('.kv-chip[data-slot="5"]').click())
        _stays(page, before)

        jump = page.locator("input[aria-label='Jump to']")
        jump.fill("9")
        settle(page, lambda: jump.press("Enter"))
        before = _strip_in_view(page, height)
        settle(page, lambda: page.locator('.kv-chip[data-slot="6"]').click())
        _stays(page, before)

        page.get_by_role("button", name="Evict a fact").click()
        page.get_by_test_id("stMainBlockContainer").get_by_text("The model answers from the one fact").wait_for(
            timeout=300_000)
        _strip_in_view(page, height)
        assert page.console == []
