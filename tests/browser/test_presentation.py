"""Presentation mode on a projector (1280×720, headless Chromium): every element scales, and one screen holds the
headline numbers, the strip around the current step and the two top-k tables, above the chat box and below the
page's header, no button label cut and no control label wrapped, and the ρ / ‖Δo‖ maps inside the column —
measured as element boxes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.browser_page import idle, settle, still

ROOT = Path(__file__).resolve().parents[2]
BOXES = """() => {
  const box = (e) => { const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left,
                                                                      right: r.right}; };
  const all = (selector) => [...document.querySelectorAll(selector)].filter(e => e.offsetParent !== null).map(box);
  const value = document.querySelector('[data-testid=stMetricValue]');
  return {header: box(document.querySelector('[data-testid=stHeader]')),
          chat: box(document.querySelector('[data-testid=stChatInput]')),
          strip: box(document.querySelector('[class*=st-key-strip]')), metrics: all('[data-testid=stMetric]'),
          tables: all('[data-testid=stTable]'), value: parseFloat(getComputedStyle(value).fontSize),
          cut: [...document.querySelectorAll('main.stMain button .stMarkdownEllipsis')]
            .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1).map(e => e.innerText),
          labels: Object.fromEntries([...document.querySelectorAll('main.stMain [data-testid=stWidgetLabel]')]
            .filter(e => e.offsetParent !== null).map(e => [e.innerText, e.getBoundingClientRect().height]))};
}"""


@pytest.mark.parametrize("demo", ["Evict a fact", "Policy run: a name asked late"])  # 52 and 98 slots
def test_one_projector_screen_holds_the_numbers_the_strip_and_both_tables(server, demo):
    from playwright.sync_api import TimeoutError as Timeout

    from benchmarks.browser import browser_page

    with browser_page(server, 1280, 720) as page:
        messages = []
        page.on("console", lambda message: messages.append((message.type, message.text)))
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=180_000)
        page.get_by_role("button", name=demo).click()
        page.locator(".kv-chip").first.wait_for(timeout=180_000)
        page.locator("[data-testid=stMetricValue]").first.wait_for(timeout=180_000)  # the what-if's numbers drawn
        idle(page)
        normal = page.evaluate(BOXES)["value"]
        settle(page, lambda: page.get_by_text("Presentation mode (large type)").click())
        page.locator("[data-testid=stTable]").first.wait_for(timeout=120_000)  # plain tables replace the grids
        page.locator("[data-testid=stSidebarHeader] button").first.click()  # the sidebar folded away
        page.wait_for_function("(s => s.dataset.collapsed === 'true' && s.getAnimations({subtree: true}).length === 0)"
                               "(document.querySelector('[data-testid=stSidebar]'))")  # folded, its slide over
        page.mouse.wheel(0, 1)  # the speaker takes the page over: the marks that held a place in view let go
        still(page)
        for attempt in range(5):  # Streamlit's chat container may keep to its bottom while it lays out: again
            page.locator("[data-testid=stMetric]").first.evaluate(  # the speaker scrolls to the numbers
                "e => { e.scrollIntoView({block: 'start'}); "
                "document.querySelector('[data-testid=stAppScrollToBottomContainer]').scrollTop -= 70; }")
            try:  # the scroll held: the numbers stand below the header
                page.wait_for_function("""() => {
                    const m = document.querySelector('[data-testid=stMetric]').getBoundingClientRect();
                    return m.top >= document.querySelector('[data-testid=stHeader]').getBoundingClientRect().bottom
                        - 10; }""", timeout=10_000)
                break
            except Timeout:
                if attempt == 4:
                    raise
        boxes = page.evaluate(BOXES)
        page.screenshot(path=str(ROOT / "assets" / "browser-test-presentation.png"))  # ignored by git
        assert boxes["value"] >= 1.2 * normal  # the numbers scale with the rest (36 → 44 px)
        top, bottom = boxes["header"]["bottom"] - 10, boxes["chat"]["top"]
        assert len(boxes["metrics"]) == 5 and len(boxes["tables"]) == 2
        for element in [*boxes["metrics"], boxes["strip"], *boxes["tables"]]:
            assert top <= element["top"] and element["bottom"] <= bottom, (element, top, bottom)
            assert 0 <= element["left"] and element["right"] <= 1280
        assert max(m["bottom"] - m["top"] for m in boxes["metrics"]) < 110  # no label or value wraps
        assert boxes["cut"] == []  # no button label cut short ("Apply to 0 se…")
        assert boxes["labels"].get("Jump to") == boxes["labels"]["Layer"], boxes["labels"]  # one line, as its row's
        page.get_by_role("tab", name="ρ and ‖Δo‖ per head").click()  # the maps fit the column (they overflowed it)
        chart = page.locator("[data-testid=stVegaLiteChart]").first
        chart.wait_for(timeout=120_000)
        idle(page)
        maps, column = chart.bounding_box(), page.locator("[data-testid=stChatInput]").bounding_box()
        assert column["x"] <= maps["x"] and maps["x"] + maps["width"] <= column["x"] + column["width"], (maps, column)
        assert not [m for m in messages if m[0] in ("warning", "error")], messages
