"""The Policy run tab in a real headless Chromium: a user policy from KVVIZ_POLICIES runs, the timeline is drawn, the
menu of evicted slots says why one went, a step opens with its next-token comparison, and its blame ranks the evicted
slots; a long run shows its progress and Stop keeps the page; a press whose window keeps recency alone asks first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("width,height", [(1500, 2200), (1280, 720)])  # one tall page; a projector's screen
def test_run_a_policy_open_a_step_and_blame_it(server, width, height):
    from benchmarks.browser import browser_page
    from tests.support.browser_page import choose, idle, in_view, still

    with browser_page(server, width=width, height=height) as page:  # the shared server has the user policy
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        page.fill("[data-testid=stChatInputTextArea]", "My name is Zorblax and I live in Quintara. I like green tea. What is my name?")
        page.keyboard.press("Enter")
        page.wait_for_selector(".kv-chip", timeout=180_000)
        # the reply streams, then the page reruns: click the tab once the page is idle
        idle(page)
        page.get_by_role("tab", name="Policy run", exact=True).click()
        form = page.get_by_role("tabpanel", name="Policy run").locator("[data-testid=stForm]")
        form.wait_for(timeout=60_000)
        # above the form: choosing a policy shows its own parameters at once
        choice = page.locator("[data-testid=stSelectbox]").filter(
            has=page.locator("label", has_text=re.compile(r"^Policy$"))).first
        choose(page, choice, "newest")  # the user's policy is offered beside the built-ins
        expect(form.get_by_text("newest: bonus")).to_have_count(1)  # the server has it: its parameter is shown
        budget = form.get_by_role("spinbutton", name="Budget (slots)")
        budget.fill("16")
        form.get_by_label("New tokens per turn").fill("8")
        expect(budget).to_have_value("16")
        form.get_by_role("button", name="Run the policy").click()
        page.get_by_text("Turn 1 · full cache").wait_for(timeout=180_000)
        still(page)  # the result comes into view by itself (on a projector it is drawn below the fold)
        assert in_view(page, page.get_by_text("Turn 1 · full cache")), page.get_by_text("Turn 1 · full cache")\
            .bounding_box()
        caption = page.get_by_text("newest, budget 16, decode")
        expect(caption, "the run's caption: " + " | ".join(
            page.locator("[data-testid=stCaptionContainer]").all_inner_texts())).to_have_count(1)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .heatmaplayer, .js-plotly-plot .hm')"
                               ".length >= 1", timeout=60_000)
        idle(page)
        page.get_by_text("processes slot").first.wait_for(timeout=60_000)  # the step's table is drawn too
        tables = page.locator("[data-testid=stDataFrame]").count()
        why = page.locator("[data-testid=stSelectbox]").filter(has_text="Why did this slot go?")
        for _ in range(3):  # a click that lands while the page redraws does not open the menu: open it again
            why.click()
            try:
                page.get_by_role("option").nth(1).wait_for(timeout=10_000)
                break
            except Exception:  # noqa: BLE001 — playwright's TimeoutError
                page.keyboard.press("Escape")
        page.get_by_role("option").nth(1).click()  # the first evicted slot
        page.get_by_text("(layer, KV head) pairs").wait_for(timeout=60_000)
        expect(page.locator("[data-testid=stDataFrame]")).to_have_count(tables + 1, timeout=30_000)  # its table
        page.get_by_role("spinbutton", name="Open step").fill("2")
        page.get_by_role("spinbutton", name="Open step").press("Enter")
        page.get_by_text("Step 2 processes slot").wait_for(timeout=60_000)
        page.get_by_role("button", name="Blame this step").click()
        page.get_by_text("Restoring one evicted slot at a time").wait_for(timeout=120_000)
        still(page)
        assert in_view(page, page.get_by_text("Restoring one evicted slot at a time"))
        page.get_by_role("button", name="Restore the top 3").click()
        page.get_by_text("restored together").wait_for(timeout=120_000)
        assert page.locator("[data-testid=stException]").count() == 0
        column = page.locator("[data-testid=stChatInput]").bounding_box()  # every table (blame's too) fits the column
        for table in page.locator("[data-testid=stDataFrame]").all():
            box = table.bounding_box()
            assert box is None or box["x"] + box["width"] <= column["x"] + column["width"] + 1, (box, column)
        page.screenshot(path=str(ROOT / "assets" / f"browser-test-policy-run-{width}.png"), full_page=True)


def test_a_long_policy_run_shows_its_progress_and_stop_keeps_the_page(server):
    """A policy run shows passes done of how many and the time left; Stop ends it and the page keeps what it had
    (no run is shown, nothing is broken), and a run after it completes."""
    from benchmarks.browser import browser_page
    from tests.support.browser_page import in_view, send, settle, still, watch_console

    with browser_page(server, height=1600) as page:
        watch_console(page)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        send(page, "Tell me a long story about a cat who travels the world.")
        page.get_by_role("tab", name="Policy run", exact=True).click()
        form = page.get_by_role("tabpanel", name="Policy run").locator("[data-testid=stForm]")
        form.wait_for(timeout=60_000)
        form.get_by_label("New tokens per turn").fill("64")
        form.get_by_role("button", name="Run the policy").click()
        bar = page.locator("[data-testid=stProgress]")
        bar.wait_for(timeout=120_000)
        expect(bar).to_contain_text("forward passes · about", timeout=60_000)
        text = bar.inner_text()
        assert "Running the full cache and the policy side by side:" in text and " of " in text
        settle(page, lambda: page.get_by_role("button", name="Stop", exact=True).last.click(), during_run=True)
        expect(page.locator("[data-testid=stProgress]")).to_have_count(0)
        assert page.get_by_text("Turn 1 · full cache").count() == 0  # the stopped run left nothing behind
        assert page.locator("[data-testid=stException]").count() == 0
        form.get_by_label("New tokens per turn").fill("4")
        form.get_by_role("button", name="Run the policy").click()
        page.get_by_text("Turn 1 · full cache").wait_for(timeout=180_000)
        still(page)  # the result comes into view by itself (on a projector it is drawn below the fold)
        assert in_view(page, page.get_by_text("Turn 1 · full cache")), page.get_by_text("Turn 1 · full cache")\
            .bounding_box()
        assert page.console == []


@pytest.mark.parametrize("width,height", [(1500, 1000), (1280, 720)])
def test_a_press_is_run_as_kvpress_runs_it_and_a_recency_only_run_asks_first(server, width, height):
    """Choosing kvpress' SnapKVPress sets Compress: prefill, its ratio and disables the slot budget; its 64-slot window
    over a one-sentence prompt would keep recency alone, so the run waits with why; *Run it anyway* runs it, and the
    caption names the press and the warning says what happened."""
    from benchmarks.browser import browser_page
    from tests.support.browser_page import choose, click_when_still, send, watch_console

    with browser_page(server, width=width, height=height) as page:
        watch_console(page)
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=120_000)
        send(page, "My secret word is mango. Remember it.")
        click_when_still(page, page.get_by_role("tab", name="Policy run", exact=True))
        form = page.get_by_role("tabpanel", name="Policy run").locator("[data-testid=stForm]")
        form.wait_for(timeout=60_000)
        choice = page.locator("[data-testid=stSelectbox]").filter(
            has=page.locator("label", has_text=re.compile(r"^Policy$"))).first
        choose(page, choice, "kvpress:SnapKVPress")
        expect(form.get_by_role("spinbutton", name="Budget (slots)")).to_be_disabled()
        expect(form.get_by_role("spinbutton", name="or kvpress ratio")).to_have_value("0.50")
        expect(form.locator("[data-testid=stSelectbox]", has_text="Compress").locator("input")).to_have_value("prefill")
        form.get_by_label("New tokens per turn").fill("4")
        click_when_still(page, form.get_by_role("button", name="Run the policy"))
        held = page.locator("[data-testid=stAlert]", has_text="Not run yet")
        held.wait_for(timeout=120_000)
        assert "snapkv protects" in held.inner_text() and "its scores will choose nothing" in held.inner_text()
        assert page.get_by_text("Turn 1 · full cache").count() == 0  # nothing ran
        click_when_still(page, page.get_by_role("button", name="Run it anyway"))
        page.get_by_text("Turn 1 · full cache").wait_for(timeout=300_000)
        expect(page.get_by_text("kvpress:SnapKVPress (run as kvviz's snapkv)")).to_have_count(1)
        expect(page.locator("[data-testid=stAlert]", has_text="its scores chose nothing")).to_have_count(1)
        expect(page.locator("[data-testid=stAlert]", has_text="Not run yet")).to_have_count(0)
        assert page.console == []
