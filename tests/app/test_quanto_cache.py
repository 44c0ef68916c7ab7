"""The page under AppTest runs a policy run on transformers' QuantizedCache (quanto backend) alone."""

from __future__ import annotations

import re

import pytest

from kvviz.schemes.quanto import QuantoCache

quanto = pytest.importorskip("optimum.quanto", reason="optimum-quanto is not installed: QuantizedCache's quanto "
                                                       "backend cannot be compared (pip install optimum-quanto)")
PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


def test_the_page_runs_a_quantized_cache_alone():
    from tests.support.app_test import assert_clean, policy_run_without_a_policy

    app = policy_run_without_a_policy(PROMPT)
    next(s for s in app.selectbox if s.label == "QuantizedCache").select("quanto 2 bits")
    next(n for n in app.number_input if n.label == "Full-precision R").set_value(8)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    settings = app.session_state["policy_run"].settings
    assert settings.policy is None and settings.cache_format == QuantoCache(2, 64, 8)
    assert any("QuantizedCache (quanto) 2 bits" in re.sub(r"\\(.)", r"\1", c.value) for c in app.caption)
