"""The deployed-quantization controls in a real headless Chromium: keys rounded before RoPE from the quantizer
settings change the what-if's KL, and the scheme comparison runs the static FP8, pre-RoPE and mixed schemes it
offers by default; the console stays free of warnings and errors."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser_page import send, settle, watch_console


@pytest.fixture(scope="module")
def page(served):
    from benchmarks.browser import browser_page

    with browser_page(served[0], width=1500, height=1400) as page:
        watch_console(page)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        yield page
        assert page.console == []


def kl_text(page) -> str:
    return page.locator("[data-testid=stMetric]", has_text="KL(full").locator("[data-testid=stMetricValue]").inner_text()


def test_pre_rope_keys_and_the_deployed_schemes_from_the_page(page):
    send(page, "My dog is called Rex. What is my dog called?")
    send(page, "And what colour is he?")
    page.get_by_text("Quantizer settings").click()
    # K and V at 4 bits, keys per channel
    settle(page, lambda: page.get_by_role("button", name="History → these bits").click())
    after_rope = kl_text(page)
    assert after_rope != "0"
    settle(page, lambda: page.get_by_text("Pre-RoPE keys").click())
    expect(page.locator("[data-testid=stMetric]", has_text="KL(full")
           .locator("[data-testid=stMetricValue]")).not_to_have_text(after_rope)  # the same slots, rounded pre-RoPE
    page.get_by_text("Compare quantization schemes at this step").click()  # an expander: opens in the browser alone
    expect(page.get_by_text("Calibration text (sets the static FP8 scales)")).to_be_visible()
    page.evaluate("""() => {  // count what the page sends the server: a rerun request is one message
        window.kvSent = 0;
        const send = WebSocket.prototype.send;
        WebSocket.prototype.send = function (data) { window.kvSent += 1; return send.call(this, data); };
    }""")
    picker = page.locator("[data-testid=stMultiSelect]", has_text="Schemes")
    removes = picker.get_by_role("button", name=re.compile("^Remove"))
    schemes = removes.count()
    removes.first.click()  # a scheme's ×
    expect(removes).to_have_count(schemes - 1)  # the chip is gone: a widget that reruns has sent its change by now
    assert page.evaluate("window.kvSent") == 0, "removing a scheme reran the page"
    settle(page, lambda: page.get_by_role("button", name="Compare the schemes").click())
    caption = page.get_by_text("nothing before this step")  # drawn from the rows: a short chat is in KIVI's window
    expect(caption).to_contain_text("kivi-2")
    expect(page.get_by_text("Cache bytes as computed")).to_be_visible()

