"""Guided tours played in the page under AppTest from start to end; a new conversation closes the tour and model text
stays text."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.components.scroll import PLACES
from kvviz.tours import load_tours, stage
from tests.support.app_test import APP, assert_clean

TOUR_NAMES = [tour.name for tour in load_tours()]


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
