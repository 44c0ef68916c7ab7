"""Guided tours on a projector (1280×720, headless Chromium, presentation mode): at every step of every tour the
card and what its caption talks about are on one screen, with no console warning and no warning in the server's
log."""

from __future__ import annotations

import re

import pytest

from kvviz.tours import load_tours
from tests.support.browser_page import idle, settle, still

TOUR_NAMES = [tour.name for tour in load_tours()]


@pytest.fixture(scope="module")
def logged(served):
    """The shared server's log and where it stood when this module began (the tours set widgets through Session
    State: Streamlit logs a warning, with a stack, for a widget that also has a default value)."""
    log = served[1]
    return log, log.stat().st_size


def _warnings(logged) -> list[str]:
    """What the server logged since this module began, besides its start: Streamlit's log lines begin with a date
    ("2026-12-07 11:52:40.006 The widget with key …", then "Stack (most recent call last):"), an uncaught error with
    a traceback."""
    log, since = logged
    with open(log, "rb") as file:
        file.seek(since)
        text = file.read().decode(errors="replace")
    return [line for line in text.splitlines()
            if re.match(r"\d{4}-\d\d-\d\d ", line) and "server started" not in line
            or line.startswith(("Traceback", "Stack (most recent call last)"))]


def _card(page) -> dict | None:
    """The tour card's box when it is whole on a 1280×720 screen — the card and every line of its heading, caption
    and where to look inside it and inside the screen: the caption is read in full without scrolling — else None."""
    card = page.locator(".st-key-tour")
    box = card.bounding_box()
    inside = lambda b: b and box["y"] - 1 <= b["y"] and b["y"] + b["height"] <= box["y"] + box["height"] + 1  # noqa: E731
    lines = [t.bounding_box() for t in card.locator("[data-testid=stMarkdownContainer] p:visible").all()]
    return box if box and lines and all(map(inside, lines)) and 0 <= box["y"] and box["y"] + box["height"] <= 720 \
        and 0 <= box["x"] and box["x"] + box["width"] <= 1280 else None


@pytest.mark.parametrize("index", range(len(TOUR_NAMES)))
def test_every_tour_step_fits_one_projector_screen_with_no_warning(server, logged, index):
    """Presentation mode at 1280×720 with the sidebar as it opens: at every step of every tour the card — its heading,
    its whole caption and Back / Next / End, docked at the bottom in the chat box's place — and what the caption
    talks about — the chip it names inside the strip's own scroll, the what-if's maps, the toy numbers, the Channels
    tab's map, the policy run or its blame — are on one screen, without scrolling, the subject above the card, and
    stay there."""
    from playwright.sync_api import expect

    from benchmarks.browser import browser_page

    tour = load_tours()[index]
    with browser_page(server, 1280, 720) as page:
        messages = []
        page.on("console", lambda message: messages.append((message.type, message.text)))
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=180_000)
        idle(page)
        sidebar = page.locator("[data-testid=stSidebar]").bounding_box()
        assert sidebar and sidebar["x"] >= 0 and sidebar["width"] > 200, sidebar  # open, as it opens
        settle(page, lambda: page.get_by_text("Presentation mode (large type)").click())
        page.get_by_role("button", name=tour.name).click()
        for number in range(1, len(tour.steps) + 1):
            page.get_by_text(f"step {number} of {len(tour.steps)}").wait_for(timeout=180_000)
            still(page)  # the step's run is over and its scroll marks let go: the page is where it stays
            step = tour.steps[number - 1]
            evicts = bool(step.evict_text)
            subject = page.locator("[data-testid=stExpander]", has_text="Toy numbers") if step.toy else \
                page.get_by_text({"run": "Turn 2 · full cache", "blame": "with nothing restored"}[step.scroll]) \
                if step.policy_run else \
                page.locator("[data-testid=stPlotlyChart]").first if step.channels else \
                page.locator(".st-key-heads") if step.scroll == "charts" else \
                page.locator(".kv-chip.kv-evicted").first if evicts else page.locator(".kv-chip.kv-current")
            block = step.toy or step.policy_run or step.channels or step.scroll == "charts"
            strip = page.locator(".kv-strip")
            if step.policy_run:  # its run and the blame of the divergence are drawn in that tab
                expect(page.get_by_text("with nothing restored", exact=False)).to_have_count(1)

            def on_screen(box, top: float = 0, bottom: float = 720) -> bool:
                return bool(box) and top <= box["y"] and box["y"] + box["height"] <= bottom and 0 <= box["x"] and \
                    box["x"] + box["width"] <= 1280

            def placed(subject=subject, block=block, strip=strip):  # each step scrolls itself to its subject
                card, where = _card(page), subject.bounding_box()
                buttons = [page.locator(f".st-key-tour-{name}").bounding_box() for name in ("next", "back", "end")]
                if not card or not all(on_screen(b) for b in buttons):
                    return None
                if block:  # toy numbers, a view, a run, the what-if's maps: it starts on screen above the card
                    inside = bool(where) and 0 <= where["y"] <= card["y"] - 40
                else:  # a chip: inside the strip's own view, above the card
                    view = strip.bounding_box()
                    inside = bool(view) and on_screen(where, view["y"], view["y"] + view["height"]) and \
                        on_screen(where, 0, card["y"])
                return (card, buttons, where) if inside else None
            assert placed(), (number, page.locator(".st-key-tour").bounding_box(), subject.bounding_box(),
                              strip.bounding_box())
            cut = page.locator(".st-key-tour button .stMarkdownEllipsis").evaluate_all(
                "(labels) => labels.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)")
            assert cut == [], cut  # no label cut short
            if number < len(tour.steps):
                page.get_by_role("button", name="Next").click()
        page.get_by_role("button", name="End", exact=True).click()
        expect(page.locator(".st-key-tour")).to_have_count(0, timeout=60_000)
        expect(page.locator("[data-testid=stChatInput]")).to_be_visible()  # the chat box is back
        assert not [m for m in messages if m[0] in ("warning", "error")], messages
    assert _warnings(logged) == []


def test_a_tour_starts_from_its_own_scroll_whatever_ran_before(server):
    """Tour 3 played to its last step (the Channels tab) and ended, then tour 4: its first step brings its own subject,
    the struck chip, into view. (A scroll mark drawn again after a while — the what-if's charts — once carried out its
    old request again and took the page away: the strip was left 1,757 px above the view.)"""
    from benchmarks.browser import browser_page
    from tests.support.browser_page import in_view

    tours = load_tours()
    with browser_page(server, 1280, 720) as page:
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=180_000)
        idle(page)
        settle(page, lambda: page.get_by_text("Presentation mode (large type)").click())
        before, after = tours[2], tours[3]
        page.get_by_role("button", name=before.name).click()
        for number in range(1, len(before.steps) + 1):
            page.get_by_text(f"step {number} of {len(before.steps)}").wait_for(timeout=180_000)
            still(page)
            if number < len(before.steps):
                page.get_by_role("button", name="Next").click()
        settle(page, lambda: page.get_by_role("button", name="End", exact=True).click())
        assert after.steps[0].evict_text and not after.steps[0].scroll  # its subject: the struck chip in the strip
        page.get_by_role("button", name=after.name).click()
        page.get_by_text(f"step 1 of {len(after.steps)}").wait_for(timeout=180_000)
        still(page)
        chip = page.locator(".kv-chip.kv-evicted").first
        box, card = chip.bounding_box(), page.locator(".st-key-tour").bounding_box()
        assert in_view(page, chip) and box["y"] + box["height"] <= card["y"], (box, card)  # above the docked card
