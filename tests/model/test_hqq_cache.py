"""A policy run whose cache is transformers' ``QuantizedCache`` with the HQQ backend, against transformers' own
QuantizedCache(backend="hqq") driven through the same model, step by step, teacher-forced on the reference's greedy
tokens (tests/model/test_quanto_cache.py's check, shared).

kvviz calls hqq's Quantizer as transformers' ``HQQQuantizedLayer`` does, on tensors of the same shape; only the cache
schedule is kvviz's own (the prompt quantized at once, a residual, flushes that quantize everything again). The K/V
the two caches receive agree up to the float32 rounding of the forward passes, so the logits are compared at ε_z
(tests/support/rounding.py) and the greedy tokens must agree. HQQ's zero points come from an iterative optimisation over
each group; a group whose input moved by rounding may settle a code away, so the cache states are compared per
element at 1e-5 relative for all but 0.1 % of the elements.
"""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.schemes.quanto import QuantoCache
from kvviz.schemes.written import run_cache
from tests.support.references import assert_steps_as_transformers

pytest.importorskip("hqq", reason="hqq is not installed: QuantizedCache's HQQ backend cannot be compared "
                                  "(pip install hqq==0.2.8)")
PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


@pytest.mark.parametrize("bits, group, residual, axis", [(4, 64, 8, 0), (2, 32, 5, 0), (8, 64, 6, 1)])
def test_an_hqq_cache_run_steps_as_transformers_quantized_cache(lm, bits, group, residual, axis):
    settings = QuantoCache(bits, group, residual, axis, axis, backend="hqq")
    assert run_cache(f"hqq-{bits}", group, residual, axis) == settings
    run = assert_steps_as_transformers(lm, settings, PROMPT)
    assert len(run.session.commits.flushes) == 1 + (2 * residual + 3) // residual


def test_a_flush_hqq_cannot_pack_is_refused_in_one_line_as_transformers_fails(lm):
    from transformers import QuantizedCache

    keys = torch.randn(lm.kv_heads, 7, 64)  # 3·7 groups of 64 channels: 2-bit codes pack in rows of 4 groups
    with pytest.raises(KvvizError, match="cannot pack 2-bit codes of a flush of 7 slots") as caught:
        QuantoCache(2, 64, 4, 1, 1, backend="hqq").flushed(keys, keys)
    assert "\n" not in str(caught.value)
    cache = QuantizedCache(backend="hqq", config=lm.model.config, nbits=2, axis_key=1, axis_value=1, q_group_size=64,
                           residual_length=4)
    with pytest.raises(RuntimeError):  # transformers' own cache, on the same K/V
        cache.update(keys[None], keys[None], 0)
    for bits in (3, 1):  # these fail in hqq's unpacking, after the codes were made
        with pytest.raises(KvvizError, match=f"cannot pack {bits}-bit codes"):
            QuantoCache(bits, 64, 4, 1, 1, backend="hqq").flushed(keys, keys)
