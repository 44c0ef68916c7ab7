"""Guided tours: every step's numbers are the live model's (each step's ``expect`` holds, and changing a number in a
tour file makes it fail), and each tour plays from start to end in the app with no error or warning."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.components.scroll import PLACES
from kvviz.tours import TOURS, check, load_tours, play, stage
from kvviz.whatif import what_if
from benchmarks.browser import CHROMIUM
from tests.support.app_test import APP, assert_clean
from tests.support.browser_page import holds

TOUR_NAMES = [tour.name for tour in load_tours()]


def test_there_are_four_tours_with_their_stories():
    assert TOUR_NAMES == ["What the KV cache is", "Eviction: what ρ and α′ mean", "Quantization: why keys per channel",
                          "A policy on a follow-up question"]
    for path in sorted(TOURS.glob("*.json")):
        json.loads(path.read_text())  # each file is plain JSON a speaker can edit


@pytest.mark.parametrize("index", range(len(TOUR_NAMES)))
def test_every_steps_numbers_are_the_models(lm, index):
    tour = load_tours()[index]
    session = play(lm, tour)
    for step in tour.steps:
        shown = stage(session, step)
        assert check(shown, step) == [], (tour.name, step.caption[:40])
        caption = shown.caption(step)
        assert "{" not in caption  # every field filled
        if shown.at > 0 and "kl" in step.caption:
            result = what_if(session, shown.draft.edit(shown.at), at=shown.at, layer=shown.layer, head=shown.head)
            assert shown.numbers["kl"] == result.next_token.kl  # computed, not written in the file
        for key, wanted in step.expect.items():  # a number changed in the file fails the check
            if isinstance(wanted, bool) or not isinstance(wanted, (int, float)):
                continue
            value = shown.numbers[key[4:]] if key[:4] in ("min_", "max_") else shown.numbers[key]
            moved = value + 1 if key.startswith("min_") else value - 1 if key.startswith("max_") else value + 1
            broken = dataclasses.replace(step, expect={key: moved})
            assert check(shown, broken), (tour.name, key)


@pytest.mark.parametrize("index", range(len(TOUR_NAMES)))
def test_a_tour_plays_start_to_end_in_the_app(index):
    app = AppTest.from_file(APP, default_timeout=600).run()
    tour = load_tours()[index]
    next(b for b in app.sidebar.button if b.label == tour.name).click().run()
    for number in range(len(tour.steps)):
        assert_clean(app)
        assert not app.warning, [w.value for w in app.warning]
        heading = next(m.value for m in app.markdown if m.value.startswith("**Tour:"))
        assert heading.endswith(f"step {number + 1} of {len(tour.steps)}")
        kept = app.session_state["tour"]
        assert kept["caption"] in [m.value for m in app.markdown]
        assert app.session_state["layer"] == stage(app.session_state["session"], tour.steps[number]).layer
        step = tour.steps[number]
        assert step.scroll in ("", *PLACES)
        if step.policy_run:  # the step opens the demo's run and blame in the Policy run tab
            assert app.session_state["view"] == "Policy run"
            result, ranked = app.session_state["policy_run"], app.session_state["policy_blame"]
            assert ranked.turn == 1 and result.turns[ranked.turn].divergence == ranked.step
            table = next(d.value for d in app.dataframe if "top-1 back" in d.value.columns)  # the blame, shown
            assert "mango" in table["text"].iloc[0] and bool(table["top-1 back"].iloc[0])
            rows = {r.kl_after_restore: r for r in ranked.rows}  # the table's numbers are the blame's, with units
            assert all(rows[kl].kl_after_restore - ranked.kl == pytest.approx(delta) and 0 <= share <= 1
                       for kl, delta, share in zip(table["KL after restore"], table["ΔKL"], table["attention share"]))
        if step.view:  # the step opens the view it talks about, on the layer and KV head it names
            assert app.session_state["view"] == step.view
            if step.channels:
                assert [app.session_state["channels_layer"], app.session_state["channels_kv_head"]] == step.channels
                assert any(c.value.startswith("Outlier key channels here: ") for c in app.caption)
        if number < len(tour.steps) - 1:
            next(b for b in app.button if b.label == "Next").click().run()
    next(b for b in app.button if b.label == "Back").click().run()
    assert app.session_state["tour"]["index"] == len(tour.steps) - 2
    next(b for b in app.button if b.label == "End").click().run()
    assert_clean(app)
    assert app.session_state["tour"] is None


def test_a_new_conversation_closes_the_tour_and_model_text_stays_text():
    app = AppTest.from_file(APP, default_timeout=600).run()
    tour = load_tours()[1]
    next(b for b in app.sidebar.button if b.label == tour.name).click().run()
    next(b for b in app.button if b.label == "Next").click().run()  # the step naming the top tokens
    caption = app.session_state["tour"]["caption"]
    assert "full cache: `" in caption  # the model's text as code spans, made by the app
    next(b for b in app.sidebar.button if b.label == "New conversation").click().run()
    assert_clean(app)
    assert app.session_state["tour"] is None and not any(m.value.startswith("**Tour:") for m in app.markdown)


@pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                    reason="Debian's chromium is not installed (scripts/test.sh installs it)")
@pytest.mark.parametrize("index", range(len(TOUR_NAMES)))
def test_every_tour_step_fits_one_projector_screen_with_no_warning(tmp_path, index):
    """Presentation mode at 1280×720: at every step of every tour the card's heading and Back / Next / End, and what
    the caption talks about — the chip it names inside the strip's own scroll, the what-if's maps, the toy numbers, the
    Channels tab's map, the policy run or its blame — are on one screen, without scrolling, and stay there."""
    from playwright.sync_api import expect

    from benchmarks.browser import browser_page, running_app

    tour = load_tours()[index]
    idle = "!document.querySelector('[data-testid=stStatusWidget]')"
    with running_app({"KVVIZ_SESSIONS": str(tmp_path)}) as url, browser_page(url, 1280, 720) as page:
        messages = []
        page.on("console", lambda message: messages.append((message.type, message.text)))
        page.wait_for_selector("[data-testid=stChatInputTextArea]", timeout=180_000)
        page.get_by_text("Presentation mode (large type)").click()
        page.wait_for_function(idle, timeout=120_000)
        page.get_by_role("button", name=tour.name).click()
        for number in range(1, len(tour.steps) + 1):
            page.get_by_text(f"step {number} of {len(tour.steps)}").wait_for(timeout=180_000)
            page.wait_for_function(idle, timeout=180_000)
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

            def placed():  # each step scrolls itself (app/components/scroll.py), the strip to the chip it names
                card, where = page.locator(".st-key-tour").bounding_box(), subject.bounding_box()
                buttons = [page.locator(f".st-key-tour-{name}").bounding_box() for name in ("next", "back", "end")]
                above_chat = page.locator("[data-testid=stChatInput]").bounding_box()["y"]  # the box covers the page
                if block:  # toy numbers, a view, a run, the what-if's maps: it starts on screen above the chat box
                    inside = bool(where) and 0 <= where["y"] <= above_chat - 40
                else:  # a chip: inside the strip's own view, above the chat box
                    view = strip.bounding_box()
                    inside = bool(view) and on_screen(where, view["y"], view["y"] + view["height"]) and \
                        on_screen(where, 0, above_chat)
                shown = card and 0 <= card["y"] and all(on_screen(b) for b in buttons) and inside
                return (card, buttons, where) if shown else None
            assert holds(page, placed), (number, page.locator(".st-key-tour").bounding_box(), subject.bounding_box(),
                                         strip.bounding_box())
            cut = page.locator(".st-key-tour button .stMarkdownEllipsis").evaluate_all(
                "(labels) => labels.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)")
            assert cut == [], cut  # no label cut short ("B", "N", "E" in a row of three)
            if number < len(tour.steps):
                page.get_by_role("button", name="Next").click()
        page.get_by_role("button", name="End", exact=True).click()
        expect(page.locator(".st-key-tour")).to_have_count(0, timeout=60_000)
        assert not [m for m in messages if m[0] in ("warning", "error")], messages


def test_steps_on_the_same_policy_demo_share_its_run(lm):
    tour = next(t for t in load_tours() if any(step.policy_run for step in t.steps))
    session = play(lm, tour)
    runs = [stage(session, step).policy_run for step in tour.steps if step.policy_run]
    assert len(runs) == 2 and runs[0][0] is runs[1][0] and runs[0][1] is runs[1][1]  # one run, then its blame
