"""The page under AppTest runs a policy run that keeps its cache and reads a subset per step (a reader)."""

from __future__ import annotations

from kvviz.policies import H2O
from kvviz.runs.compressed import RunSettings
from kvviz.runs.policy_run import run_policy

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"


def test_the_page_runs_a_reader_alone(lm):
    """The Policy run tab's *Read per step with*: H2O choosing 16 slots per step, no policy evicting — the run of the
    library, its label on the page."""
    from tests.support.app_test import assert_clean, policy_run_without_a_policy

    app = policy_run_without_a_policy(PROMPT)
    next(s for s in app.selectbox if s.label == "Read per step with").select("h2o")
    next(n for n in app.number_input if n.label == "Slots read per step").set_value(16)
    next(n for n in app.number_input if n.label == "New tokens per turn").set_value(4)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    shown = app.session_state["policy_run"]
    assert shown.settings.reader == H2O() and shown.settings.reads == 16 and shown.settings.policy is None
    alone = run_policy(lm, [PROMPT], RunSettings(reader=H2O(), reads=16), 4).last
    assert shown.last.policy_text == alone.policy_text
    assert [round(r.visible) for r in shown.last.records[1:]] == [16] * (len(shown.last.records) - 1)  # step -1: all
