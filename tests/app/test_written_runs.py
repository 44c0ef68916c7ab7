"""The page under AppTest runs a policy run with a per-slot cache format."""

from __future__ import annotations

from kvviz.schemes.written import QUANTIZED_FP8, WrittenCache
from kvviz.runs.compressed import RunSettings
from kvviz.runs.policy_run import run_policy

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"


def test_the_page_runs_a_cache_format(lm):
    """The Policy run tab's *Cache format*: an NVFP4 cache alone, its run the same as the library's; with KIVI on as
    well, refused in one line and the run shown stays."""
    from tests.support.app_test import assert_clean, policy_run_without_a_policy

    app = policy_run_without_a_policy(PROMPT)
    next(s for s in app.selectbox if s.label == "Cache format").select("nvfp4")
    next(n for n in app.number_input if n.label == "New tokens per turn").set_value(4)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    shown = app.session_state["policy_run"]
    assert shown.settings.cache_format == WrittenCache("nvfp4")
    alone = run_policy(lm, [PROMPT], RunSettings(cache_format=WrittenCache("nvfp4")), 4).last
    assert shown.last.policy_text == alone.policy_text
    app.button[[b.label for b in app.button].index("Blame this step")].click().run()  # its rounded slots
    assert_clean(app)
    assert app.session_state["policy_blame"].of == "rounded" and app.session_state["policy_blame"].rows
    next(c for c in app.checkbox if c.label == "KIVI quantization").check().run()
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert any("one cache: KIVI K2/V2 and nvfp4 cannot be combined" in w.value.replace("\\", "")  # escaped Markdown
               for w in app.warning)
    assert app.session_state["policy_run"] is shown
    next(c for c in app.checkbox if c.label == "KIVI quantization").uncheck().run()
    next(s for s in app.selectbox if s.label == "QuantizedCache").select("fp8")
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert any("one cache" in w.value for w in app.warning) and app.session_state["policy_run"] is shown
    next(s for s in app.selectbox if s.label == "Cache format").select("16 bits (as computed)")
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    assert app.session_state["policy_run"].settings.cache_format == QUANTIZED_FP8
