"""A kvpress press chosen in the Policy run tab, through AppTest on the bundled model: it sets what kvpress does
(compress after the prompt, at a ratio; the slot budget off), its caption names the press, and a run whose budget
held only the press's protected window says so — before it runs, and after — instead of degenerating silently."""

from __future__ import annotations

from tests.support.app_test import assert_clean, open_view, start


def _widget(widgets, label: str):
    return next(w for w in widgets if w.label == label)


def test_a_press_sets_prefill_and_its_ratio_and_warns_when_it_keeps_recency_only():
    app = start()
    app.chat_input[0].set_value("My secret word is mango. Remember it.").run()
    open_view(app, "Policy run")
    assert _widget(app.selectbox, "Compress").value == "decode"
    assert not _widget(app.number_input, "Budget (slots)").disabled
    _widget(app.selectbox, "Policy").set_value("kvpress:SnapKVPress").run()
    assert_clean(app)
    assert _widget(app.selectbox, "Compress").value == "prefill"
    assert _widget(app.number_input, "or kvpress ratio").value == 0.5
    assert _widget(app.number_input, "Budget (slots)").disabled
    assert app.number_input(key="run-kvpress:SnapKVPress-window_size").value == 64  # its own parameters, at once
    _widget(app.text_area, "Turns (one per line; default: this conversation's messages)").set_value(
        "My secret word is mango. Remember it.\nWhat is my secret word?")
    _widget(app.number_input, "New tokens per turn").set_value(6)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert any("Not run yet" in w.value for w in app.warning)  # held back: see the test below
    app.button(key="run-anyway").click().run()
    assert_clean(app)
    result = app.session_state["policy_run"]
    assert result.settings.mode == "prefill" and result.settings.budget.ratio == 0.5
    assert any(c.value.replace("\\", "").startswith("kvpress:SnapKVPress (run as kvviz's snapkv) · snapkv")
               for c in app.caption)  # (escaped: plain text in Markdown)
    # a 64-slot window over a prompt of a few dozen slots: every kept slot is protected, nothing is chosen
    assert result.recency_only(0)[0] >= 1
    assert any(w.value.replace("\\", "").startswith("Turn 1: at ") and "its scores chose nothing" in w.value
               for w in app.warning)


def test_a_policy_of_kvviz_keeps_the_budget_and_names_itself_once():
    app = start()
    app.chat_input[0].set_value("My secret word is mango. Remember it.").run()
    open_view(app, "Policy run")
    _widget(app.number_input, "New tokens per turn").set_value(4)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    result = app.session_state["policy_run"]
    assert result.settings.budget == 32 and result.settings.mode == "decode"
    assert any(c.value.replace("\\", "").startswith("h2o, budget 32, decode") for c in app.caption)
    assert not any("its scores chose nothing" in w.value for w in app.warning)


def test_a_run_that_would_keep_recency_only_asks_before_it_runs(lm):
    """The forecast before a run equals what the run then does: SnapKVPress' 64-slot window over a prompt of a few
    dozen slots at ratio 0.5 is held back with why (nothing run, nothing kept), *Run it anyway* runs it and the run
    reports recency only; an 8-slot window runs at once, and the forecast said it would choose."""
    from kvviz.policies.base import Ratio
    from kvviz.policies.kvpress.presses import from_kvpress
    from kvviz.runs.compressed import RunSettings
    from kvviz.runs.forecast import Forecast, first_compression

    text = "My secret word is mango. Remember it."
    wide = first_compression(lm, [text], RunSettings(from_kvpress("SnapKVPress").policy, Ratio(0.5), "prefill"))
    narrow = first_compression(lm, [text], RunSettings(from_kvpress("SnapKVPress", window_size=8).policy,
                                                       Ratio(0.5), "prefill"))
    assert wide.recency_only and not narrow.recency_only and wide.at == narrow.at == wide.keep * 2 + wide.at % 2
    app = start()
    app.chat_input[0].set_value(text).run()
    open_view(app, "Policy run")
    _widget(app.selectbox, "Policy").set_value("kvpress:SnapKVPress").run()
    _widget(app.number_input, "New tokens per turn").set_value(4)
    _widget(app.text_area, "Turns (one per line; default: this conversation's messages)").set_value(text)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    assert "policy_run" not in app.session_state  # held back: nothing ran
    held = [w.value.replace("\\", "") for w in app.warning if "Not run yet" in w.value]
    advice = wide.advice(True, "Budget (slots)", "kvpress ratio", ("window_size", 64))
    assert held == [f"Not run yet: {wide} {advice}"] and f"keeps {wide.keep} of {wide.at} slots" in held[0]
    # the advice names the press's controls, not the budget its form disables: its ratio and its window_size
    assert wide.protected >= wide.at  # the 64-slot window covers the whole prompt: no ratio helps, a smaller window
    assert advice == (f"To let it choose: no kvpress ratio can (snapkv protects all {wide.at} slots), or set "
                      f"window_size (now 64) below {wide.keep}.")
    assert Forecast("snapkv", 100, 50, 60).advice(True, ratio="kvpress ratio") == \
        "To let it choose: lower kvpress ratio to 0.39 or less (it then keeps at least 61 of 100 slots)."
    assert Forecast("h2o", 33, 32, 40).advice(False, "Budget (slots)") == \
        "To let it choose: raise Budget (slots) to 41 or more."
    app.button(key="run-anyway").click().run()
    assert_clean(app)
    result = app.session_state["policy_run"]
    assert result.recency_only(0) == (1, 1) and result.last.prompt_end == wide.at
    assert not any("Not run yet" in w.value for w in app.warning)
    app.number_input(key="run-kvpress:SnapKVPress-window_size").set_value(8)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    assert not any("Not run yet" in w.value for w in app.warning)
    assert app.session_state["policy_run"].recency_only(0) == (0, 1)
    app.number_input(key="run-kvpress:SnapKVPress-window_size").set_value(64)  # held back again: the 8-slot run's
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()  # result is not shown as this one
    assert_clean(app)
    assert any("Not run yet" in w.value for w in app.warning)
    assert any(c.value.startswith("The previous run's result is hidden") for c in app.caption)
    assert not [m.value for m in app.markdown if "full cache" in m.value]  # no turn of the earlier run below
    app.button(key="run-change").click().run()
    assert [m.value for m in app.markdown if "full cache" in m.value]  # there again
