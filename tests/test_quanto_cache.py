"""A policy run whose cache is transformers' ``QuantizedCache`` (quanto backend), against transformers' own
QuantizedCache driven through the same model, step by step, teacher-forced on the reference's greedy tokens.

Both sides run the same weights and attention kernel; only the cache differs, so the comparison is of the cache's
schedule (prompt quantized at once, a residual, flushes that quantize everything again) and of quanto's rounding,
which kvviz reproduces with the same floating-point operations (checked bit for bit below). The K/V the two caches
receive are the same up to the float32 rounding of the forward passes (ε_z, tests/support/rounding.py, at the logits); a
value that sits within that rounding of a quantization boundary could land one step away, so the logits are
compared at ε_z and the greedy tokens must agree.
"""

from __future__ import annotations

import re

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.quant.quantizer import fake_quantize
from kvviz.runs.compressed import RunSettings
from kvviz.quant.quanto import QuantoCache
from tests.support.references import assert_steps_as_transformers

quanto = pytest.importorskip("optimum.quanto", reason="optimum-quanto is not installed: QuantizedCache's quanto "
                                                       "backend cannot be compared (pip install optimum-quanto)")
PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


@pytest.mark.parametrize("bits, group", [(4, 64), (2, 32)])
def test_quantos_axis_0_rounding_is_kvvizs_per_token_quantizer(bits, group):
    x = torch.randn(1, 3, 37, 64, generator=torch.Generator().manual_seed(bits)) * 3
    qtype = quanto.qint4 if bits == 4 else quanto.qint2
    scale, shift = quanto.MaxOptimizer()(x, qtype, 0, group)
    theirs = quanto.quantize_weight(x, qtype, 0, scale, shift, group).dequantize()
    assert torch.equal(theirs[0], fake_quantize(x[0], bits, QuantoCache(bits, group).quantizer))


@pytest.mark.parametrize("bits, group, residual, axis", [(4, 64, 8, 0), (2, 32, 5, 0), (4, 3, 6, -1)])
def test_a_quantized_cache_run_steps_as_transformers_quantized_cache(lm, bits, group, residual, axis):
    run = assert_steps_as_transformers(lm, QuantoCache(bits, group, residual, axis, axis), PROMPT)
    assert len(run.session.commits.flushes) == 1 + (2 * residual + 3) // residual


def test_quantized_cache_settings_are_refused_in_one_line():
    with pytest.raises(KvvizError, match="nbits 2, 4"):
        QuantoCache(nbits=3)
    with pytest.raises(KvvizError, match="0 or -1 with quanto"):
        QuantoCache(axis_key=1)
    from kvviz.quant.kivi import Kivi

    with pytest.raises(KvvizError, match="without KIVI"):
        RunSettings(kivi=Kivi(2, 2, 32, 128), quanto=QuantoCache())


def test_the_page_runs_a_quantized_cache_alone():
    from tests.support.app_test import assert_clean, open_view, start

    app = start()
    app.chat_input[0].set_value(PROMPT).run()
    open_view(app, "Policy run")
    next(s for s in app.selectbox if s.label == "Policy").select("(none: a quantized cache only)")
    next(s for s in app.selectbox if s.label == "QuantizedCache").select("quanto 2 bits")
    next(n for n in app.number_input if n.label == "Full-precision R").set_value(8)
    app.button[[b.label for b in app.button].index("Run the policy")].click().run()
    assert_clean(app)
    settings = app.session_state["policy_run"].settings
    assert settings.policy is None and settings.quanto == QuantoCache(2, 64, 8)
    assert any("QuantizedCache (quanto) 2 bits" in re.sub(r"\\(.)", r"\1", c.value) for c in app.caption)


def test_a_flush_quantos_axis_minus_1_cannot_group_is_refused_in_one_line_as_transformers_fails(lm):
    from transformers import QuantizedCache

    keys = torch.randn(lm.kv_heads, 7, 64)  # 3·7 rows: groups of 64 do not divide them
    with pytest.raises(KvvizError, match="cannot quantize a flush of 7 slots on axis -1") as caught:
        QuantoCache(4, 64, 4, -1, -1).flushed(keys, keys)
    assert "\n" not in str(caught.value)
    cache = QuantizedCache(backend="quanto", config=lm.model.config, nbits=4, axis_key=-1, axis_value=-1,
                           q_group_size=64, residual_length=4)
    with pytest.raises((RuntimeError, ValueError)):  # transformers' own cache, on the same K/V
        cache.update(keys[None], keys[None], 0)
