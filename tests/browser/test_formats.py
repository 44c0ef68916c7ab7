"""A format with an axis or a width of its own fits the edit being tried, in a real headless Chromium (its own module:
tests/browser/test_quantization.py keeps one Playwright page open for its module, and a second Playwright cannot
start in the same thread while it runs)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.support.browser_page import choose, send, settle, watch_console


def kl_text(page) -> str:
    return page.locator("[data-testid=stMetric]", has_text="KL(full").locator("[data-testid=stMetricValue]").inner_text()


@pytest.mark.parametrize("width,height,large", [(1500, 1000, False), (1280, 720, True)])
def test_choosing_nvfp4_fits_the_edit_being_tried_and_says_what_it_changed(server, width, height, large):
    """History at 2 bits (int, keys per channel), then Format → nvfp4 in the quantizer settings: the draft is moved to
    the format's 4 bits along tokens at once, a note says what changed, and the what-if follows — no "settings do not
    fit", no Clear edit — on a desk and on a projector (presentation mode, the sidebar open)."""
    from benchmarks.browser import browser_page

    with browser_page(server, width=width, height=height) as page:
        watch_console(page)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        if large:
            settle(page, lambda: page.get_by_text("Presentation mode (large type)").click())
        send(page, "Name three colours.")
        send(page, "And two more?")
        for key in ("pick_k", "pick_v"):  # the bit picker under the strip (its menu, not its label's help)
            choose(page, page.locator(f".st-key-{key} input"), "2")
        settle(page, lambda: page.get_by_role("button", name="History → these bits").click())
        page.get_by_text("Quantizer settings").click()
        choose(page, page.locator(".st-key-number_format input"), "nvfp4")
        note = page.locator("[data-testid=stAlert]", has_text="nvfp4 stores 4 bits")
        expect(note).to_contain_text("keys and values per token")
        expect(note).to_contain_text("to 4 bits")
        expect(page.get_by_text("do not fit")).to_have_count(0)
        assert kl_text(page) not in ("0", "—")
        assert page.console == []
