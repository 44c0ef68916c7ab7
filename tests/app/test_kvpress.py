"""The page under AppTest offers kvpress' presses by name in both policy pickers."""

from __future__ import annotations

from kvviz.policies.base import Ratio
from kvviz.policies.kvpress.presses import from_kvpress


def test_the_app_offers_presses_by_name_in_both_policy_pickers():
    from tests.support.app_test import assert_clean, open_view, start

    app = start()
    app.chat_input[0].set_value("Tom has two cats, Rex and Max. Name his cats.").run()
    open_view(app, "Policies")
    next(s for s in app.selectbox if s.label == "Policy").set_value("kvpress:SnapKVPress").run()
    assert_clean(app)
    assert app.number_input(key="policy-0-kvpress:SnapKVPress-window_size").value == 64  # kvpress' names, defaults
    next(b for b in app.button if b.label.startswith("Put kvpress:SnapKVPress")).click().run()
    assert_clean(app)
    session, draft = app.session_state["session"], app.session_state["draft"]
    at = len(session) - 1
    assert draft.policy == from_kvpress("SnapKVPress").policy.edit(session, Ratio(0.5), at)  # kvpress' rounding
    open_view(app, "Policy run")
    form_policy = next(s for s in app.selectbox if s.label == "Policy")
    form_policy.set_value("kvpress:TOVAPress")
    next(s for s in app.selectbox if s.label == "Compress").set_value("prefill")
    next(n for n in app.number_input if n.label == "or kvpress ratio").set_value(0.5)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    result = app.session_state["policy_run"]
    assert result.settings.policy == from_kvpress("TOVAPress").policy and result.settings.budget.ratio == 0.5
    kept = int(result.last.steps[0].visible + 0.5)
    assert kept == max(1, int(result.last.prompt_end * 0.5))  # int(n·(1 − r)) of the prompt's slots
