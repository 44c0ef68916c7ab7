"""A policy run whose cache is transformers' ``QuantizedCache`` (quanto backend), against transformers' own
QuantizedCache driven through the same model, step by step, teacher-forced on the reference's greedy tokens.

Both sides run the same weights and attention kernel; only the cache differs, so the comparison is of the cache's
schedule (prompt quantized at once, a residual, flushes that quantize everything again) and of quanto's rounding,
which kvviz reproduces with the same floating-point operations (checked bit for bit in tests/unit). The K/V the two
caches receive are the same up to the float32 rounding of the forward passes (ε_z, tests/support/rounding.py, at the
logits); a value that sits within that rounding of a quantization boundary could land one step away, so the logits are
compared at ε_z and the greedy tokens must agree.
"""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.schemes.quanto import QuantoCache
from tests.support.references import assert_steps_as_transformers

quanto = pytest.importorskip("optimum.quanto", reason="optimum-quanto is not installed: QuantizedCache's quanto "
                                                       "backend cannot be compared (pip install optimum-quanto)")
PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


@pytest.mark.parametrize("bits, group, residual, axis", [(4, 64, 8, 0), (2, 32, 5, 0), (4, 3, 6, -1)])
def test_a_quantized_cache_run_steps_as_transformers_quantized_cache(lm, bits, group, residual, axis):
    run = assert_steps_as_transformers(lm, QuantoCache(bits, group, residual, axis, axis), PROMPT)
    assert len(run.session.commits.flushes) == 1 + (2 * residual + 3) // residual


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
