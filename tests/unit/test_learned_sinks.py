"""Learned attention sinks (gpt-oss: ``self_attn.sinks``, one logit per layer and query head, a column with no value in
each softmax's denominator), on a tiny random gpt-oss whose sinks are drawn to bite (tiny_models.SINKS) and whose
layers alternate sliding-window and full attention.

The references are transformers' own eager gpt-oss attention, nothing of kvviz involved: one forward without cache
and with a float 4D mask per layer kind (a single mask would drop the sliding window: the model takes a mapping from
layer kind to mask), each row seeing what its step saw. (The cached chat, the recorded weights, the policies, blame and
session files pass the same oracles as every family: tests/unit/test_architectures.py.)

Tolerances: kvviz's steps and the reference differ in summation order (cached decode vs one pass; kvviz's float32
softmax with the sink as a log-sum-exp vs eager's concatenated column), so logits agree within the model's logit
rounding ε_z and probabilities within (e^{2ε} − 1)·p (tests/support/rounding.py); the weights within the rounding of
the scores they come from (weight_rounding, as the recorded-weights oracle argues)."""

from __future__ import annotations

import pytest
import torch

from kvviz import attention_math as am
from kvviz.edit.edit import Edit
from kvviz.policies import StreamingLLM
from kvviz.runs.compressed import RunSettings
from kvviz.session import Session
from kvviz.tiny_models import WINDOW
from kvviz.tiny_sessions import tiny_pair
from kvviz.whatif import what_if
from tests.support.references import assert_rerotated_run_is_the_compacted_cache, causal_rows, teacher_forced
from tests.support.rounding import logit_rounding, probability_rounding, weight_rounding

TURNS = ["a = 3, b = 5. What is a + b?", "And a - b? Say it in words."]
KINDS = {"sliding_attention": WINDOW, "full_attention": None}


@pytest.fixture(scope="module")
def gpt_oss(tokenizer):
    lm, eager, session = tiny_pair("gpt_oss", tokenizer, TURNS)
    assert lm.attention.windows == (WINDOW, None, WINDOW) and len(session) > 2 * WINDOW
    return lm, eager, session


def _masks(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Float 4D masks ``(1, 1, n, n)`` per layer kind from each row's allowed slots ``rows`` (bool ``(n,)`` each),
    causal and within the window in the sliding layers (0 = attend, −inf = hidden)."""
    allowed = torch.stack(rows)
    n = len(rows)
    near = torch.arange(n)[:, None] - torch.arange(n)[None] < WINDOW
    return {kind: torch.zeros(n, n).masked_fill(~(allowed & (near if window else True)), float("-inf"))[None, None]
            for kind, window in KINDS.items()}


def _eager(eager, ids: list[int], rows: list[torch.Tensor], attentions: bool = False):
    with torch.no_grad():
        return eager(input_ids=torch.tensor([ids]), attention_mask=_masks(rows), use_cache=False,
                     output_attentions=attentions)


def test_the_rule_holds_each_layers_sinks_and_they_take_real_mass(gpt_oss):
    lm, _, session = gpt_oss
    modules = [layer.self_attn for layer in lm.model.model.layers]
    assert torch.equal(lm.attention.sink(None).float(), torch.stack([m.sinks.detach() for m in modules]))
    at = len(session) - 1
    mass = torch.stack([am.sink_mass(session.weights(layer, at, at + 1)[:, 0].double()) for layer in range(lm.layers)])
    assert float(mass.max()) > 0.5 and float(mass.min()) < 0.1  # some heads mostly on the sink, some hardly


def test_a_what_if_eviction_equals_a_masked_forward_and_alpha_prime_is_the_masked_softmax(gpt_oss):
    """With a sink, evicting slots leaves the sink's logit in the denominator: the masked softmax is still α/(1−ρ)
    over the kept slots, and the sink's own mass becomes α_sink/(1−ρ). Both against eager's weights of the masked
    row (the sink's mass there is 1 − the row's sum) in layer 0, where the edited run's query is still the full run's
    (above it, the eviction has moved the hidden states the queries come from: α′ is the isolated change there)."""
    lm, eager, session = gpt_oss
    at = len(session) - 1
    evicted = [1, 2, at - 20, at - 5, at - 2]  # one outside the sliding layers' window, two inside
    rows = causal_rows(at + 1, evicted)
    out = _eager(eager, session.transcript.ids[: at + 1], rows, attentions=True)
    reference = torch.softmax(out.logits[0, -1].double(), -1)
    layer, head = 0, 4  # a sliding-window layer; head 4 gives the sink most of its attention
    result = what_if(session, Edit.evict(evicted), at=at, layer=layer, head=head, topk=20)
    rel = probability_rounding(logit_rounding(lm.config, out.logits[0, -1]))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel)
    masked = out.attentions[layer][0, head, -1].double()  # (at + 1,): eager's weights of the masked row
    queries, keys = session.queries.layer(layer), session.layer_kv(layer)[0]
    tol = weight_rounding(lm.config, layer, queries, keys, lm.scaling)
    renorm = torch.tensor([0.0 if v is None else v for v in result.detail.alpha_renorm], dtype=torch.float64)
    assert torch.allclose(renorm, masked, rtol=tol, atol=1e-12)
    full, scaled, edited = result.detail.sink
    rho = result.rho(layer, head)
    assert scaled == pytest.approx(full / (1 - rho), rel=1e-12)
    assert scaled == pytest.approx(1 - float(masked.sum()), rel=tol, abs=1e-9)
    assert edited == pytest.approx(scaled, rel=1e-9)  # eviction alone: the edited run's weights are α′
    assert result.sink(layer, head) == (pytest.approx(full), pytest.approx(edited)) and scaled > full


def test_a_streaming_llm_run_equals_one_masked_forward_step_by_step(gpt_oss):
    """A decode-time StreamingLLM run on the sink model, teacher-forced, against one no-cache eager forward whose row
    of each step sees the step's kept slots and itself (and, in the sliding layers, only the window of them)."""
    lm, eager, _ = gpt_oss
    budget, steps = 20, 8
    run, _, logits, seen = teacher_forced(lm, RunSettings(StreamingLLM(), budget, "decode"), TURNS[1], steps)
    prompt = run.prompt_end[0]
    ids = run.session.transcript.ids[: prompt + steps]
    rows = causal_rows(len(ids))
    for step in range(steps):
        slot = prompt + step
        kept = list(range(4)) + list(range(slot - (budget - 4), slot))  # StreamingLLM: 4 sinks + the newest
        assert torch.equal(seen[step][1, 0, :slot].nonzero()[:, 0], torch.tensor(kept))
        rows[slot] = torch.zeros(len(ids), dtype=torch.bool)
        rows[slot][kept + [slot]] = True
    out = _eager(eager, ids, rows)
    for step in range(steps):
        reference = out.logits[0, prompt + step]
        assert (reference - logits[step]).abs().max() <= logit_rounding(lm.config, reference), step


def test_a_quantization_what_if_equals_the_model_on_the_rounded_cache(gpt_oss):
    """4-bit keys and values, rounded by the test itself (per token, groups of the head dim), against eager attention
    on a cache that holds them: the sink's logit is not quantized (it is a weight, not a cached tensor)."""
    from kvviz import kv_cache
    from kvviz.quant.quantizer import Quantizer, fake_quantize

    lm, eager, session = gpt_oss
    at = len(session) - 1
    edit = Edit(key_bits=dict.fromkeys(range(at), 4), value_bits=dict.fromkeys(range(at), 4),
                keys=Quantizer("token"), values=Quantizer("token"))
    tensors = [tuple(fake_quantize(t[0, :, :at].float(), 4, Quantizer("token"))[None]
                     for t in kv_cache.layer_kv(session.cache, layer)) for layer in range(lm.layers)]
    slot = session.transcript.slots[at]
    with torch.no_grad():
        out = eager(input_ids=torch.tensor([[slot.id]]), position_ids=torch.tensor([[slot.position]]),
                    cache=kv_cache.build(lm.config, tensors), use_cache=True)
    reference = torch.softmax(out.logits[0, -1].double(), -1)
    result = what_if(session, edit, at=at, topk=20)
    rel = probability_rounding(logit_rounding(lm.config, out.logits[0, -1]))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel, abs=1e-12)
    assert result.next_token.kl > 0
    full, edited = result.sink(0, 0)
    assert full != edited  # rounded keys move the scores, so the sink's share moves too


def test_a_rerotated_run_moves_yarn_keys_as_the_models_own_rope(tokenizer):
    """gpt-oss's RoPE is YaRN: fixed frequencies, cos and sin scaled by one attention factor, which every cached key
    already carries. A re-rotated StreamingLLM run turns the kept keys by the position change alone; the reference
    compacts the cache and moves the keys with the model's own rotary embedding (tests/support/references.py). Full
    attention in every layer: re-rotated runs need one kept set in all layers, which sliding windows break (refused
    in one line, as for every windowed model)."""
    lm, _, _ = tiny_pair("gpt_oss", tokenizer, [], layer_types=["full_attention"] * 3)
    assert lm.model.model.rotary_emb.attention_scaling != 1  # the factor the rotation must leave alone
    assert_rerotated_run_is_the_compacted_cache(lm, TURNS[1])


def test_the_notebook_widget_and_the_strip_data_carry_the_sinks_share(gpt_oss):
    from kvviz.notebook import widget
    from kvviz.view_data import sink_share

    lm, _, session = gpt_oss
    at = len(session) - 1
    # one head's weights against all heads' (a float32 product of another shape: each weight within 2^-23 of the
    # other, summed over the at + 1 slots); the head's own sink, not head 0's (the bug this caught)
    tol = (at + 1) * 2**-23
    shown = sink_share(session, at, 2, 4)
    expected = float(am.sink_mass(session.weights(2, at, at + 1)[4, 0].double()))
    assert shown == {"share": pytest.approx(expected, abs=tol), "layer": 2, "head": "head 4"}
    w = widget(session)
    assert w.sink["share"] == pytest.approx(float(am.sink_mass(
        session.weights(0, at, at + 1)[:, 0].double().mean(0))), abs=tol)  # layer 0, the mean of heads
    assert sink_share(Session(tiny_pair("llama", lm.tokenizer, [])[0]), 0, 0, None) is None
