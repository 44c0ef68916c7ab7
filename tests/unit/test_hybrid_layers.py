"""Hybrid models (Qwen3-Next, Qwen3.5): Gated DeltaNet layers keep a recurrent state, no K/V; only the attention layers
cache. On a tiny random Qwen3-Next (kvviz.tiny_models: decoder layers 0 and 2 recurrent, 1 and 3 attention with a
gated output and partial RoPE, a mixture of experts), kvviz's layer axis holds layers 1 and 3.

The references are transformers' own model with eager attention, nothing of kvviz involved: one forward without cache
whose attention layers get a float 4D mask (0 allowed, −inf masked), each row seeing what its step saw, while the
recurrent layers see every token (as in the model: an eviction cannot reach them); or transformers' own cache, filled
by its own forward, for a step on stored tensors the test rounds itself. (The cached chat, the recorded weights, an
eviction at the pending step, every policy, blame and session files pass the same oracles as every family:
tests/unit/test_architectures.py.)

Tolerances: the session's states came from chunked prefills and one-token decode steps, a rebuilt state from one
chunked pass over the recorded inputs, the reference from one pass without cache: the same sums in other orders, so
logits agree within the model's logit rounding ε_z and probabilities within (e^{2ε} − 1)·p
(tests/support/rounding.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvviz import kv_cache, recurrent
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.policies import H2O, StreamingLLM
from kvviz.quant.quantizer import Quantizer, fake_quantize
from kvviz.runs.compressed import RunSettings
from kvviz.tiny_sessions import tiny_pair
from kvviz.whatif import what_if
from tests.support.references import (assert_a_step_failing_in_the_last_layer_raises,
                                      assert_rerotated_run_is_the_compacted_cache, assert_step_effects_are_what_ifs,
                                      masked_step, per_head_masked_forward, teacher_forced)
from tests.support.rounding import logit_rounding, probability_rounding

TURNS = ["a = 3, b = 5. What is a + b?", "And a - b? Say it in words."]


@pytest.fixture(scope="module")
def hybrid(tokenizer):
    return tiny_pair("qwen3_next", tokenizer, TURNS)


def _close(lm, result, logits: torch.Tensor) -> None:
    """The what-if's edited top-k against reference ``logits`` ``(V,)``, within the probability rounding."""
    reference = torch.softmax(logits.double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, logits))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel, abs=1e-12)


def test_only_the_attention_layers_cache_kv_and_the_bytes_count_the_states(hybrid):
    lm, _, session = hybrid
    config = lm.config
    assert recurrent.kv_layers(config) == (1, 3) and lm.layers == 2
    assert len(kv_cache.entries(session.cache)) == 2 and len(session.cache.layers) == 4
    n = len(session)
    kv = 2 * 2 * config.num_key_value_heads * n * config.head_dim * 4  # 2 layers, K and V, float32
    conv = (2 * config.linear_num_key_heads * config.linear_key_head_dim
            + config.linear_num_value_heads * config.linear_value_head_dim) * config.linear_conv_kernel_dim
    state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    assert session.memory().kv_bytes == kv + 2 * (conv + state) * 4
    assert session.queries.inputs.length == n  # each recurrent layer's input per slot, to rebuild its state


@pytest.mark.parametrize("back", [1, 12, 30])
def test_a_what_if_at_an_earlier_step_starts_from_the_state_as_it_stood(hybrid, back):
    """Time travel: the step of an earlier slot, on the K/V before it and the recurrent states rebuilt before it,
    equals the forward without cache masked at that row; the unedited side equals the row unmasked."""
    lm, _, session = hybrid
    at = len(session) - back
    evicted = [2, 5, 7, at - 2]
    result = what_if(session, Edit.evict(evicted), at=at, topk=20)
    _close(lm, result, masked_step(session, at, evicted))
    full = masked_step(session, at, [])
    reference = torch.softmax(full.double(), -1)
    rel = probability_rounding(logit_rounding(lm.config, full))
    for candidate in result.next_token.full:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel, abs=1e-12)
    assert result.next_token.kl > 0


def test_a_rebuilt_state_equals_the_live_one(hybrid):
    """Before the pending slot the what-if uses the live cache's states; rebuilt from the recorded inputs they are the
    same numbers up to float32 summation order: the conv state holds the last inputs' projections (sums of 64 terms,
    each within 64·u ≈ 4e-6 of its size, computed in batches of another shape); the recurrent state accumulates
    every token's update, chunked (64 tokens) instead of one by one."""
    lm, _, session = hybrid
    rebuilt = recurrent.states_at(lm.model, session.queries.inputs, len(session))
    for layer, (conv, state) in recurrent.live_states(session.cache).items():
        assert torch.allclose(rebuilt[layer][0], conv, rtol=0, atol=64 * 2**-24 * float(conv.abs().max()))
        assert torch.allclose(rebuilt[layer][1], state, rtol=0, atol=1e-5 * float(state.abs().max()))
        assert not torch.equal(rebuilt[layer][1], torch.zeros_like(state))


@pytest.mark.parametrize("before_rope", [False, True], ids=["as_cached", "before_rope"])
def test_a_quantization_what_if_equals_transformers_on_a_cache_the_test_rounds(hybrid, before_rope):
    """4-bit keys and 8-bit values (int, per token), rounded by the test, against the eager model stepping on
    transformers' own cache (filled by its own forward over the earlier slots, its recurrent states included) whose
    K/V the test replaced by the rounded ones. Keys rounded before RoPE: the test turns them back with the model's own
    rotary embedding and ``apply_rotary_pos_emb`` (partial RoPE: the first quarter of each head turns), rounds them
    there and turns them forward again."""
    from kvviz.rope import pre_rope
    from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb

    lm, eager, session = hybrid
    at = len(session) - 5
    keys = Quantizer("token", **pre_rope(lm)) if before_rope else Quantizer("token")
    edit = Edit(key_bits=dict.fromkeys(range(at), 4), value_bits=dict.fromkeys(range(at), 8),
                keys=keys, values=Quantizer("token"))
    ids = session.transcript.ids
    cache = DynamicCache(config=eager.config)
    with torch.no_grad():
        eager(input_ids=torch.tensor([ids[:at]]), cache=cache, use_cache=True)
        cos, sin = eager.model.rotary_emb(cache.layers[1].keys, torch.arange(at)[None])
        for entry in kv_cache.entries(cache):
            stored = entry.keys
            if before_rope:
                stored = apply_rotary_pos_emb(stored, stored, cos, -sin)[1]
            stored = fake_quantize(stored[0], 4, Quantizer("token"))[None]
            entry.keys = apply_rotary_pos_emb(stored, stored, cos, sin)[1] if before_rope else stored
            entry.values = fake_quantize(entry.values[0], 8, Quantizer("token"))[None]
        logits = eager(input_ids=torch.tensor([[ids[at]]]), position_ids=torch.tensor([[at]]), cache=cache,
                       use_cache=True).logits[0, -1]
    result = what_if(session, edit, at=at, topk=20)
    _close(lm, result, logits)
    assert result.next_token.kl > 0


@pytest.mark.parametrize("policy", [StreamingLLM(sinks=4), H2O()], ids=["streaming_llm", "h2o"])
def test_a_policy_run_equals_one_masked_forward_step_by_step(hybrid, policy):
    """A decode-time run, teacher-forced, against one forward without cache of the eager model: each attention layer's
    row of a step sees that step's kept slots and itself (H2O's differ by layer), the recurrent layers every token."""
    lm, eager, _ = hybrid
    budget, steps = 20, 8
    run, _, logits, seen = teacher_forced(lm, RunSettings(policy, budget, "decode"), TURNS[1], steps)
    prompt = run.prompt_end[0]
    ids = run.session.transcript.ids[: prompt + steps]
    for step in range(steps):
        kept = seen[step][:, :, : prompt + step]  # (L, KV, slot)
        assert (kept.sum(-1) == min(budget, prompt + step)).all(), step
    out = per_head_masked_forward(eager, ids, seen, prompt, recurrent.kv_layers(lm.config))
    for step in range(steps):
        reference = out[prompt + step]
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step


def test_a_failed_pass_leaves_the_recurrent_states_as_they_were(tokenizer):
    """A decode step that fails in its last layer (after the recurrent layers below it ran) leaves the session as it
    was: the next step gives the logits of a session that never failed."""
    lm, _, session = tiny_pair("qwen3_next", tokenizer, TURNS[:1], new_tokens=3)
    _, _, twin = tiny_pair("qwen3_next", tokenizer, TURNS[:1], new_tokens=3)
    before = {k: tuple(t.clone() for t in v) for k, v in recurrent.live_states(session.cache).items()}
    assert_a_step_failing_in_the_last_layer_raises(lm, session)
    for layer, (conv, state) in recurrent.live_states(session.cache).items():
        assert torch.equal(conv, before[layer][0]) and torch.equal(state, before[layer][1])
    session.step(), twin.step()
    assert torch.equal(session.logits, twin.logits)


def test_kvpress_own_code_reads_each_attention_layer_where_the_model_numbers_it(hybrid):
    """kvpress' hooks read a layer's keys from the cache at the module's ``layer_idx`` — the decoder layer (1 and 3
    here), not kvviz's 0 and 1: kvpress' own classes keep what the native policies keep, and its DecodingPress keeps,
    per layer and KV head, the 24 largest −‖k‖ of what it held after every 3rd step (docs/kvpress.md; the rule written
    out as in tests/model/test_kvpress_code.py)."""
    from kvviz.policies.base import Ratio
    from kvviz.policies.kvpress import own_code
    from kvviz.policies.kvpress.presses import from_kvpress, from_press
    from kvviz.runs.compressed import CompressedSession

    lm, _, _ = hybrid
    kvpress = own_code.kvpress()

    def kept(policy) -> torch.Tensor:
        run = CompressedSession(lm, RunSettings(policy, Ratio(0.5), "prefill"))
        run.add_turn(TURNS[0] + " " + TURNS[1])
        return run.alive()

    for press, native in ((kvpress.KnormPress(), from_kvpress("KnormPress")),
                          (kvpress.StreamingLLMPress(n_sink=2), from_kvpress("StreamingLLMPress", n_sink=2))):
        assert torch.equal(kept(from_press(press).policy), kept(native.policy)), type(press).__name__
    with pytest.raises(KvvizError, match="SnapKVPress failed in layer 0"):  # kvpress' own query rebuild does not know
        kept(from_press(kvpress.SnapKVPress(window_size=8)).policy)  # Qwen3-Next's gated q_proj (kvpress' limit)
    press = from_press(kvpress.DecodingPress(base_press=kvpress.KnormPress(), compression_interval=3, target_size=24))
    run = CompressedSession(lm, RunSettings(press.policy, press.ratio, press.mode, press.every))
    run.add_turn(TURNS[0])
    prompt = len(run)
    order = [torch.arange(prompt).expand(lm.kv_heads, -1) for _ in range(lm.layers)]
    for step in range(7):
        run.step()
        mirror = run.scratch["kvpress_mirror"]
        for layer in range(lm.layers):
            grown = torch.cat([order[layer], torch.full((lm.kv_heads, 1), prompt + step - 1)], -1) if step else order[layer]
            if step and step % 3 == 0:
                keys = run.session.layer_kv(layer)[0]  # (KV, n, D)
                norms = keys.gather(1, grown[..., None].expand(-1, -1, lm.head_dim)).norm(dim=-1)
                grown = grown.gather(-1, (-norms).topk(24, dim=-1).indices)
            order[layer] = grown
            assert torch.equal(mirror.slots[layer], grown), (step, layer)


def test_a_rerotated_run_turns_the_rotated_quarter_alone(hybrid):
    """Re-rotated positions with partial RoPE: Qwen3-Next rotates the first quarter of each head's channels, so a
    re-rotated StreamingLLM run turns those by the position change and leaves the rest; the reference compacts
    transformers' own cache (its recurrent layers stepping on) and moves the keys with the model's own rotary embedding
    and ``apply_rotary_pos_emb`` (tests/support/references.py)."""
    assert_rerotated_run_is_the_compacted_cache(hybrid[0], TURNS[1])


def test_where_an_eviction_matters_is_each_steps_what_if(hybrid):
    """"Where the edit matters" re-runs the reply's steps with a mask each — on a hybrid model one pass per step (each
    from its recurrent states before it): each step's KL equals the what-if of that step, to the KL rounding."""
    _, eager, session = hybrid
    assert_step_effects_are_what_ifs(session, eager, Edit.evict([3, 4, 5]))


def test_the_command_line_and_the_notebook_widget_run_on_a_hybrid_model(hybrid, tokenizer, tmp_path):
    """``whatif`` from a saved tiny Qwen3-Next folder, and the widget's clicks, each equal to ``what_if``."""
    import json

    from kvviz.notebook import widget
    from kvviz.tiny_models import tiny
    from tests.support.cli import cli

    tiny("qwen3_next").save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    done = cli("whatif", "--model", str(tmp_path), "--turn", TURNS[0], "--max-new-tokens", "3", "--json", "--evict",
               "3,5")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["next_token"]["kl"] > 0
    _, _, session = hybrid
    w = widget(session)
    w.set_state({"request": {"kind": "evict", "slot": 4, "n": 1}})
    assert w.kl == what_if(session, Edit.evict([4])).next_token.kl and not w.error
