"""Static FP8 scales (kvviz.schemes.calibration): calibrated on a text as vLLM's checkpoint ``k_scale`` / ``v_scale`` are, or
1.0 (vLLM's default), with values past the range saturated — against references built here: a plain transformers
forward's cache for the calibration, a cache holding the test's own FP8 K/V for the what-if, a session file for the
replay (the round trip itself: tests/unit/test_fp8_static.py).

Tolerances. The calibration's magnitudes come from two forwards with different attention code (kvviz's recorder, the
eager reference): the keys and values of layer ℓ differ by the float32 rounding of the hidden states after ℓ + 1
layers (tests/support/rounding.py's ε, of their magnitude) plus the projection's and RoPE's own rounding (4u of the largest
entry), and a maximum moves no more than its arguments. The what-if against the stored cache differs only in summation
order: probabilities within (e^{2ε} − 1)·p (tests/support/references.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz import kv_cache
from kvviz.schemes.calibration import CALIBRATION_TEXT, calibrate
from kvviz.cli import main
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, fake_quantize, saturated
from kvviz.schemes.catalogue import Scheme, schemes
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if
from kvviz.schemes.compare import compare_schemes
from tests.support.references import assert_what_if_is_the_stored_cache
from tests.support.rounding import U, residual_rounding

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"


def reference(x: torch.Tensor, fmt: str, scale: torch.Tensor) -> torch.Tensor:
    """``x`` through an FP8 cache with fixed scales ``scale`` (broadcast over ``x``): saturate, torch's cast, back."""
    top = torch.finfo(DTYPES[fmt]).max
    return (x / scale).clamp(-top, top).to(DTYPES[fmt]).float() * scale


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT)


def test_the_calibration_is_the_largest_magnitude_a_plain_forward_caches(lm, eager_model):
    calibration = calibrate(lm)
    session = Session(lm)
    session.add_user_turn(CALIBRATION_TEXT)  # the same rendering: the chat template, the system prompt
    ids = session.transcript.ids
    with torch.no_grad():
        out = eager_model(input_ids=torch.tensor([ids]), use_cache=True).past_key_values
    assert tuple(calibration.key_amax.shape) == (lm.layers, lm.kv_heads)
    for layer in range(lm.layers):
        for cached, ours in ((out.layers[layer].keys, calibration.key_amax), (out.layers[layer].values,
                                                                              calibration.value_amax)):
            peak = cached[0].abs().amax((1, 2))  # (KV,)
            scale = float(peak.max())
            bound = residual_rounding(lm.config, scale, layer + 1) + 4 * U * scale
            assert float((ours[layer] - peak).abs().max()) <= bound
    assert calibrate(lm) is calibration  # memoized: the app asks on every rerun


def test_unit_scales_are_vllms_default_and_per_layer_scales_share_the_layers_peak(lm):
    calibration = calibrate(lm)
    keys, values = calibration.quantizers("e4m3", "unit")
    assert keys.axis == "tensor" and {s for row in keys.scales for s in row} == {1.0}
    x = torch.randn(lm.kv_heads, 9, lm.head_dim) * 300
    assert torch.equal(fake_quantize(x, 8, keys, 0), x.clamp(-448, 448).to(torch.float8_e4m3fn).float())
    keys, values = calibration.quantizers("e5m2", "tensor")
    for layer in (0, 29):
        peak = calibration.value_amax[layer].max()  # float32, divided in float32 as the scale is stored
        assert values.scales[layer] == (float(peak / 57344),) * lm.kv_heads
    keys, _ = calibration.quantizers("e4m3", "head")
    assert keys.scales[7] == tuple((calibration.key_amax[7] / 448).tolist())


def test_a_static_fp8_what_if_equals_a_cache_holding_the_tests_fp8_kv(lm, chat):
    at = len(chat) - 1
    calibration = calibrate(lm)
    edit = Scheme("fp8-e4m3-head-static").edit([e.added for e in chat.transcript.growth], at, calibration)
    tensors = []
    for layer in range(lm.layers):
        own = []
        for t, amax in zip(kv_cache.layer_kv(chat.cache, layer), (calibration.key_amax, calibration.value_amax)):
            scale = (amax[layer] / 448).reshape(-1, 1, 1)
            own.append(reference(t[0, :, :at].float(), "e4m3", scale)[None])
        tensors.append(tuple(own))
    result = what_if(chat, edit, at=at, topk=20)
    assert_what_if_is_the_stored_cache(chat, result, tensors)
    assert result.next_token.kl > 0
    rows = compare_schemes(chat, schemes(["fp8-e4m3-head-static", "fp8-e4m3-head"]), at)
    assert rows[0].kl == result.next_token.kl and rows[1].saturated == 0
    clipped = sum(saturated(t[0, :, :at], q, layer) for layer in range(lm.layers)
                  for t, q in zip(kv_cache.layer_kv(chat.cache, layer), (edit.keys, edit.values)))
    assert rows[0].saturated == clipped
    # the identity: static quantizers with no slot quantized change nothing
    assert what_if(chat, Edit(keys=edit.keys, values=edit.values), at=at).next_token.kl == 0


def test_static_scales_that_do_not_fit_are_refused_in_one_line_and_change_nothing(lm, chat):
    at, version = len(chat) - 1, chat.version
    before = [t.clone() for t in chat.layer_kv(3)]
    refusals = [
        (lambda: Quantizer("token", format="e4m3", scales=((1.0,),)), "per KV head or per layer"),
        (lambda: Quantizer("head", format="int", scales=((1.0,),)), "for FP8"),
        (lambda: Quantizer("head", format="e4m3", scales=((1.0, -2.0),)), "positive, finite"),
        (lambda: Quantizer("head", format="e4m3", scales=((1.0, 2.0), (1.0,))), "the same number"),
        (lambda: what_if(chat, Edit.quantize(range(at), 8, keys=Quantizer("head", format="e4m3", scales=((1.0,) * 3,) * 2)),
                         at), "calibrate on this model"),
        (lambda: Scheme("fp8-e4m3-head-static").edit([at + 1], at), "needs a calibration"),
        (lambda: Scheme("fp8-e4m3-unit+hadamard"), "takes \\+hadamard"),
        (lambda: calibrate(lm, "  "), "calibration text is empty"),
    ]
    for attempt, message in refusals:
        with pytest.raises(KvvizError, match=message) as caught:
            attempt()
        assert "\n" not in str(caught.value)
    assert chat.version == version and all(torch.equal(a, b) for a, b in zip(chat.layer_kv(3), before))


def test_a_committed_static_edit_replays_from_its_session_file(make_chat, lm):
    session = make_chat(PROMPT)
    keys, values = calibrate(lm).quantizers("e5m2", "tensor")
    session.commit(Edit.quantize(range(len(session) - 1), 8, keys=keys, values=values))
    session.generate(3)
    document = json.loads(json.dumps(export_session(session)))  # the scales travel as JSON numbers, as in a file
    restored, _, _ = import_session(lm, document)
    assert restored.commits.stack == session.commits.stack
    assert torch.equal(restored.logits, session.logits)
    for layer in (0, 17):
        assert all(torch.equal(a, b) for a, b in zip(restored.layer_kv(layer), session.layer_kv(layer)))


def test_quant_compare_prints_static_schemes_with_what_they_clip(capsys):
    code = main(["quant-compare", "--turn", PROMPT, "--max-new-tokens", "2", "--scheme", "fp8-e4m3-head-static",
                 "--scheme", "fp8-e4m3-unit", "--calibration", "Hello there.", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["scheme"] for r in rows] == ["fp8-e4m3-head-static", "fp8-e4m3-unit"]
    assert rows[0]["saturated"] > 0  # a two-word calibration leaves the conversation's larger values clipped
    assert all(r["bytes"] < r["full_bytes"] for r in rows)


def test_per_layer_scales_calibrated_on_the_prompt_store_it_as_transformers_fp8_cache(make_chat, lm):
    """transformers' ``QuantizedCache(backend="fp8")`` (``Fp8QuantizedLayer``) freezes one e4m3 scale per layer at
    the prompt's largest |k| and |v|: kvviz's per-layer static scales calibrated on that prompt are those scales, and
    its quantizer stores the prompt's K/V as that cache does. Both forwards run the same ids through the same model
    and attention function in one pass, so the K/V are the same float32 values and the comparison is exact."""
    from transformers import QuantizedCache

    session = make_chat(PROMPT)
    n = len(session)
    cache = QuantizedCache(backend="fp8", config=lm.model.config)
    with torch.no_grad():
        lm.model(input_ids=torch.tensor([session.transcript.ids]), cache=cache, use_cache=True)
    keys, values = calibrate(lm, PROMPT).quantizers("e4m3", "tensor")
    edit = Edit.quantize(range(n), 8, keys=keys, values=values)
    for layer in range(lm.layers):
        own = cache.layers[layer]
        for quantizer, stored in ((keys, own._quantized_keys), (values, own._quantized_values)):
            assert quantizer.scales[layer][0] == float(stored[1])
        ours = edit.quantized(*session.layer_kv(layer), layer)
        theirs = (own._dequantize(own._quantized_keys)[0], own._dequantize(own._quantized_values)[0])
        assert all(torch.equal(a[:, :n], b) for a, b in zip(ours, theirs)), layer
