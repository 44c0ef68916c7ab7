"""The page under AppTest says why a slot went, in the Policies tab and in a policy run."""

from __future__ import annotations

from tests.support.app_test import assert_clean, open_view, start

PROMPT = "Rex is my dog and Tom is my cat. Which of them barks?"


def why_table(app):
    return next(frame.value for frame in app.dataframe if "lowest kept score" in frame.value.columns)


def test_the_app_says_why_a_slot_went_in_the_policies_tab_and_the_policy_run():
    app = start()
    app.chat_input[0].set_value(PROMPT).run()
    open_view(app, "Policies")
    app.selectbox(key="policy-why").set_value(3).run()
    assert_clean(app)
    lm = app.session_state["session"].lm
    table = why_table(app)
    assert len(table) == lm.layers * lm.kv_heads and {"score", "lowest kept score", "why"} <= set(table.columns)
    open_view(app, "Policy run")
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    result = app.session_state["policy_run"]
    slot = result.evictions()[0]["slot"]
    app.selectbox(key=f"run-why-{id(result)}-0").set_value(slot).run()
    assert_clean(app)
    table = why_table(app)
    assert len(table) == len(result.why(slot)) and set(table["outcome"]) == {"evicted"}
