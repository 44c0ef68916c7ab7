"""Keys quantized before RoPE (KVQuant's pre-RoPE keys; ``Quantizer.rope``, scheme suffix ``+prerope``): each cached
key is rotated back by its position, rounded there, and rotated forward again — against references written here with
the model's own rotary embedding (transformers' ``rotary_emb`` and ``apply_rotary_pos_emb``), on the bundled model's
keys (a what-if against a cache holding the test's own K/V, a session file).

Tolerances. The model's rotary embedding computes the same float32 angles (position × frequency, one product each),
cosines, sines and ``x·cos + rotate_half(x)·sin`` as kvviz, so the round trips are compared exactly. The error bound
is the pre-RoPE bound of each channel pair (a rotation keeps a pair's length) plus 8u of the pair's magnitudes for
the two rotations' rounding. The what-if against the stored cache differs only in summation order (tests/support/references.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from tests.support.error_bounds import error_bound
from kvviz.errors import KvvizError
from kvviz.model import resolve_checkpoint
from kvviz.quant.quantizer import Quantizer, fake_quantize
from kvviz.rope import rope_frequencies
from kvviz.schemes.catalogue import Scheme, schemes
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.tiny_sessions import tiny_pair
from kvviz.whatif import what_if
from kvviz.schemes.compare import compare_schemes
from tests.support.references import assert_what_if_is_the_stored_cache

PROMPT = "My dog is called Rex and my cat is called Whiskers. The cat sleeps on the red sofa. What is my dog called?"


def model_rope(lm, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``keys`` ``(KV, n, D)`` rotated to ``positions`` ``(n,)`` by the model's own rotary embedding."""
    cos, sin = lm.model.model.rotary_emb(keys[None], positions[None])
    return apply_rotary_pos_emb(keys[None], keys[None], cos, sin)[1][0]


def reference(lm, keys: torch.Tensor, bits: int, plain: Quantizer) -> torch.Tensor:
    """Cached keys ``(KV, n, D)`` at positions ``0..n-1``: back before RoPE, rounded by ``plain``, rotated again."""
    positions = torch.arange(keys.shape[1])
    return model_rope(lm, fake_quantize(model_rope(lm, keys, -positions), bits, plain), positions)


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, generate=3)


@pytest.mark.parametrize("bits, axis, outliers", [(2, "channel", 0), (4, "token", 0), (2, "channel", 4)])
def test_the_round_trip_is_the_models_rope_around_the_plain_quantizer(lm, bits, axis, outliers):
    generator = torch.Generator().manual_seed(bits)
    pre = torch.randn(lm.kv_heads, 50, lm.head_dim, generator=generator)
    pre[:, :, [5, 37]] *= 20  # outlier channels before RoPE, as the model's keys have
    keys = model_rope(lm, pre, torch.arange(50))
    quantizer = Quantizer(axis, outliers=outliers, rope=rope_frequencies(lm))
    out = fake_quantize(keys, bits, quantizer, positions=torch.arange(50))
    assert torch.equal(out, reference(lm, keys, bits, Quantizer(axis, outliers=outliers)))
    bound = error_bound(keys, bits, quantizer, positions=torch.arange(50))
    assert bool(((out - keys).abs() <= bound).all())
    assert not torch.equal(out, keys)


def test_a_pre_rope_what_if_equals_a_cache_holding_the_tests_keys(lm, chat):
    at = len(chat) - 1
    edit = Scheme("int2-channel+prerope").edit([e.added for e in chat.transcript.growth], at, rope=rope_frequencies(lm))
    tensors = []
    for layer in range(lm.layers):
        keys, values = kv_cache.layer_kv(chat.cache, layer)
        own_keys = reference(lm, keys[0, :, :at].float(), 2, Quantizer("channel"))
        own_values = fake_quantize(values[0, :, :at].float(), 2, Quantizer("token"))
        tensors.append((own_keys[None], own_values[None]))
    result = what_if(chat, edit, at=at, topk=20)
    assert_what_if_is_the_stored_cache(chat, result, tensors)
    assert what_if(chat, Edit(keys=edit.keys), at=at).next_token.kl == 0  # nothing quantized: the identity


def test_pre_rope_keys_per_channel_lose_less_on_the_bundled_model(chat):
    """KVQuant's observation on this model: RoPE turns each channel pair by a position-dependent angle, so a channel's
    outliers smear over its pair and over positions; per-channel scales fit the keys before RoPE better."""
    rows = {r.scheme: r for r in compare_schemes(chat, schemes(
        ["int2-channel", "int2-channel+prerope", "int3-channel", "int3-channel+prerope"]))}
    for bits in (2, 3):
        plain, pre = rows[f"int{bits}-channel"], rows[f"int{bits}-channel+prerope"]
        assert pre.kl < plain.kl and pre.bytes == plain.bytes
    assert "keys rounded before RoPE" in rows["int2-channel+prerope"].label


def test_pre_rope_quantization_that_cannot_hold_is_refused_in_one_line(lm, chat):
    at, version, theta = len(chat) - 1, chat.version, rope_frequencies(lm)
    tokenizer = AutoTokenizer.from_pretrained(resolve_checkpoint(None)[0])
    gemma, _, _ = tiny_pair("gemma3", tokenizer, ["hi"], 1)
    refusals = [
        (lambda: Edit(values=Quantizer("token", rope=theta)), "values carry no RoPE"),
        (lambda: what_if(chat, Edit.quantize(range(at), 2, keys=Quantizer("channel", rope=theta + theta)), at),
         "do not rotate"),  # more pairs than the head has (fewer: partial RoPE, checked against the model's below)
        (lambda: what_if(chat, Edit.quantize(range(at), 2, keys=Quantizer("channel", rope=theta[:8])), at),
         "not this model's RoPE"),
        (lambda: what_if(chat, Edit.quantize(range(at), 2, keys=Quantizer("channel", rope=tuple(2 * f for f in theta))),
                         at), "not this model's RoPE"),
        (lambda: Quantizer("channel", rope=(1.0, -1.0)), "positive and finite"),
        (lambda: Quantizer("head", format="e4m3", scales=((1.0,),), rope=theta), "pre-RoPE keys"),
        (lambda: Scheme("int2-channel+prerope").edit([at + 1], at), "needs the model's RoPE"),
        (lambda: Scheme("int2-channel+hadamard+outliers4"), "takes \\+hadamard or \\+outliersK"),
        (lambda: Scheme("int2-channel+prerope+prerope"), "takes \\+hadamard"),
        (lambda: rope_frequencies(gemma), "different RoPE frequencies"),
    ]
    for attempt, message in refusals:
        with pytest.raises(KvvizError, match=message) as caught:
            attempt()
        assert "\n" not in str(caught.value)
    assert chat.version == version


def test_a_committed_pre_rope_edit_replays_from_its_session_file(make_chat, lm):
    session = make_chat(PROMPT)
    keys = Quantizer("channel", rope=rope_frequencies(lm))
    session.commit(Edit.quantize(range(len(session) - 1), 3, keys=keys))
    session.generate(3)
    restored, _, _ = import_session(lm, json.loads(json.dumps(export_session(session))))
    assert restored.commits.stack == session.commits.stack
    assert torch.equal(restored.logits, session.logits)
    assert all(torch.equal(a, b) for a, b in zip(restored.layer_kv(11), session.layer_kv(11)))
