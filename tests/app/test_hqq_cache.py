"""The page under AppTest runs a policy run on transformers' QuantizedCache with the HQQ backend."""

from __future__ import annotations

import pytest

from kvviz.schemes.quanto import QuantoCache

pytest.importorskip("hqq", reason="hqq is not installed: QuantizedCache's HQQ backend cannot be compared "
                                  "(pip install hqq==0.2.8)")
PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


def test_the_page_runs_an_hqq_cache():
    import re

    from tests.support.app_test import assert_clean, policy_run_without_a_policy

    app = policy_run_without_a_policy(PROMPT)
    next(s for s in app.selectbox if s.label == "QuantizedCache").select("hqq 4 bits")
    next(n for n in app.number_input if n.label == "Full-precision R").set_value(8)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    assert app.session_state["policy_run"].settings.cache_format == QuantoCache(4, 64, 8, backend="hqq")
    assert any("QuantizedCache (hqq) 4 bits" in re.sub(r"\\(.)", r"\1", c.value) for c in app.caption)
