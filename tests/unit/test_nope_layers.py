"""Layers without RoPE (SmolLM3's NoPE layers: transformers' ``self_attn.use_rope`` False), on a tiny random SmolLM3
whose layer 1 of 3 applies none. What a NoPE layer changes for kvviz is what moves or unrotates keys: a re-rotated
run must leave its keys where they are, and a key rounded "before RoPE" there is the key as stored. (The cached chat,
the eviction what-if, the policies, blame and session files pass the same oracles as every family:
tests/unit/test_architectures.py.)

References use transformers' own pieces: the model's rotary embedding and ``apply_rotary_pos_emb``, applied only in
the layers whose attention applies it (the model's own flag), and the model's forward on a cache the test builds.
Tolerances: the re-rotated run and the compacted reference compute the same float32 rotations (one product per
angle) but attend with different kernels, so their logits agree within the model's logit rounding
(tests/support/rounding.py), as the bundled model's re-rotation test argues; the what-if against the stored cache
differs only in summation order (tests/support/references.py)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, fake_quantize
from kvviz.rope import Rotary, no_rope_layers, pre_rope, rope_frequencies
from kvviz.session_file import export_session, import_session
from kvviz.tiny_sessions import tiny_pair
from kvviz.whatif import what_if
from tests.support.references import assert_rerotated_run_is_the_compacted_cache, assert_what_if_is_the_stored_cache

TURNS = ["a = 3, b = 5. What is a + b? Tell me, and then tell me a story about a cat."]


@pytest.fixture(scope="module")
def smollm3(tokenizer):
    lm, _, session = tiny_pair("smollm3", tokenizer, TURNS)
    assert no_rope_layers(lm) == (1,) and [layer.self_attn.use_rope for layer in lm.model.model.layers] == [1, 0, 1]
    return lm, session


def _rope(model, keys: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Keys ``(1, KV, n, D)`` rotated to ``positions`` by the model's rotary embedding (negative: rotated back)."""
    cos, sin = model.model.rotary_emb(keys, torch.tensor([positions]))
    return apply_rotary_pos_emb(keys, keys, cos, sin)[1]


def test_a_rerotated_run_moves_the_keys_of_rope_layers_only(smollm3):
    lm, _ = smollm3
    run = assert_rerotated_run_is_the_compacted_cache(lm, TURNS[0], budget=16)  # keys moved: not the NoPE layer's
    n = len(run.session)
    for layer in range(lm.layers):  # the live cache: the NoPE layer's keys as computed, the others' moved
        live = kv_cache.layer_kv(run.session.cache, layer)[0][0, :, :n]
        assert torch.equal(live, run.timeline.computed[layer, :, :n]) == (layer == 1), layer


def test_keys_rounded_before_rope_are_rounded_as_stored_in_a_nope_layer(smollm3):
    lm, session = smollm3
    at = len(session) - 1
    edit = Edit(key_bits=dict.fromkeys(range(at), 2), value_bits=dict.fromkeys(range(at), 2),
                keys=Quantizer("channel", **pre_rope(lm)), values=Quantizer("token"))
    tensors = []
    for layer in range(lm.layers):
        keys, values = (t[:, :, :at].float() for t in kv_cache.layer_kv(session.cache, layer))
        if layer in (0, 2):  # RoPE layers: back before RoPE with the model's own rotary embedding, rounded, forward
            positions = list(range(at))
            pre = _rope(lm.model, keys, [-p for p in positions])
            own = _rope(lm.model, fake_quantize(pre[0], 2, Quantizer("channel"))[None], positions)
        else:  # the NoPE layer: the stored key is the key before RoPE
            own = fake_quantize(keys[0], 2, Quantizer("channel"))[None]
        tensors.append((own, fake_quantize(values[0], 2, Quantizer("token"))[None]))
    result = what_if(session, edit, at=at, topk=20)
    assert_what_if_is_the_stored_cache(session, result, tensors)
    rounded_as_post_rope = Edit(key_bits=edit.key_bits, value_bits=edit.value_bits,
                                keys=Quantizer("channel", rope=rope_frequencies(lm)), values=Quantizer("token"))
    with pytest.raises(KvvizError, match=r"layers without RoPE are not this model's \(1\)"):
        what_if(session, rounded_as_post_rope, at=at)  # a quantizer that would unrotate the NoPE layer is refused
    assert Edit.from_dict(edit.to_dict()) == edit and edit.to_dict()["keys"]["no_rope"] == [1]  # session files


def test_a_committed_pre_rope_edit_replays_from_a_session_file(smollm3):
    lm, chat = smollm3
    session, _, _ = import_session(lm, export_session(chat))
    at = len(session) - 1
    session.commit(Edit(key_bits=dict.fromkeys(range(at), 2), keys=Quantizer("channel", **pre_rope(lm))))
    session.step()
    restored, _, _ = import_session(lm, export_session(session))
    assert restored.commits.stack[0].edit.keys.no_rope == (1,) and torch.equal(restored.logits, session.logits)


def test_a_nope_layer_is_rope_with_every_frequency_zero(smollm3):
    lm, session = smollm3
    keys = kv_cache.layer_kv(session.cache, 1)[0][0].float()
    delta = torch.arange(keys.shape[1])
    assert torch.equal(Rotary.for_layer(lm, 1).rotate(keys, -delta), keys)  # the channel view's keys before RoPE
    assert not torch.equal(Rotary.for_layer(lm, 0).rotate(keys, -delta), keys)
    assert torch.equal(Rotary(lm).rotate(keys, delta, layer=1), keys)
    assert len(rope_frequencies(lm)) == lm.head_dim // 2 and Quantizer("channel", rope=None, no_rope=(1,)).no_rope == ()
