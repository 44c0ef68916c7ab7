"""The channel view (kvviz.channels) on the bundled model: magnitudes as cached, pre-RoPE keys against the model's
own key projection without RoPE (an independent path: a no-cache forward's hidden states through the layer's norm
and k_proj), outlier channels and per-channel errors against formulas written here.

Tolerances. The pre-RoPE keys of the two paths differ by the float32 rounding of the hidden states after ``layer``
decoder layers between two batch shapes (tests/support/rounding.py's ε at that depth, of the keys' magnitude), plus the
rotation back: cos/sin and two products per element, 4u of the key's largest entry.
"""

from __future__ import annotations

import pytest
import torch

from kvviz.channels import OUTLIER_FACTOR, channels, outliers_by_layer, outliers_of
from kvviz.quant.quantizer import Quantizer, fake_quantize
from kvviz.session import Session
from tests.support.references import full_forward
from tests.support.rounding import U, residual_rounding

PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, generate=6)


@pytest.mark.parametrize("layer", [0, 12, 29])
def test_pre_rope_keys_are_the_models_keys_without_rope(lm, chat, eager_model, layer):
    at = len(chat)
    view = channels(chat, layer, 1, at)
    out = full_forward(eager_model, chat.transcript.ids[:at], output_hidden_states=True)
    block = eager_model.model.layers[layer]
    with torch.no_grad():
        keys = block.self_attn.k_proj(block.input_layernorm(out.hidden_states[layer][0]))  # (n, KV·D)
    reference = keys.view(at, lm.kv_heads, lm.head_dim)[:, 1].abs()
    scale = float(reference.max())
    bound = residual_rounding(lm.config, scale, layer + 1) + 4 * U * scale
    assert float((view.keys_pre - reference).abs().max()) <= bound
    cached = chat.layer_kv(layer)[0][1, :at].float().abs()
    assert torch.equal(view.keys, cached)
    pairs = lm.head_dim // 2  # RoPE rotates channel pairs (c, c + D/2): their joint magnitude is kept
    joint = lambda m: (m[:, :pairs] ** 2 + m[:, pairs:] ** 2).sqrt()  # noqa: E731
    assert torch.allclose(joint(view.keys), joint(view.keys_pre), rtol=8 * U, atol=8 * U * scale)


def test_outliers_and_errors_follow_their_definitions(chat):
    view = channels(chat, 18, 2, bits=2)
    peaks = view.keys_pre.amax(0)
    median = float(peaks.median())
    assert view.outliers == [c for c in range(len(peaks)) if float(peaks[c]) >= OUTLIER_FACTOR * median]
    assert view.outliers  # this layer has some (KIVI's observation, on this model)
    keys = chat.layer_kv(18)[0][2:3].float()
    for name, quantizer in (("per token", Quantizer("token")), ("per channel", Quantizer("channel"))):
        expected = (fake_quantize(keys, 2, quantizer) - keys)[0].square().mean(0).sqrt()
        assert torch.equal(view.errors[name], expected)
    rest = [c for c in range(len(peaks)) if c not in view.outliers]
    # per channel gives the ordinary channels less error than per token, whose scales the outliers stretch
    assert float(view.errors["per channel"][rest].mean()) < float(view.errors["per token"][rest].mean())
    assert float(view.errors["per token, 4 outliers exact"].min()) == 0


def test_at_4_bits_the_fp4_formats_show_their_block_error(chat):
    """NVFP4 and MXFP4 errors per key channel: torchao's round trip of the layer's keys (NVFP4's tensor scale spans
    the layer's KV heads), this head's RMS error per channel; bit for bit (elementwise, correctly rounded ops)."""
    from tests.support import torchao_reference as ao

    view = channels(chat, 18, 2, bits=4)
    keys = chat.layer_kv(18)[0].float()  # (KV, n, D)
    for name, reference in (("NVFP4 (blocks of 16)", ao.nvfp4), ("MXFP4 (blocks of 32)", ao.mxfp4)):
        rounded = reference(keys.reshape(-1, keys.shape[-1])).view(keys.shape)
        assert torch.equal(view.errors[name], (rounded - keys)[2].square().mean(0).sqrt())
    assert "NVFP4 (blocks of 16)" not in channels(chat, 18, 2, bits=2).errors
    from kvviz.figures.channel_maps import channel_errors

    lines = [trace.name for trace in channel_errors(view).data if trace.type == "scatter"]
    assert lines == [f"4-bit {name}" for name in view.errors] and len(lines) == 6  # every quantizer drawn


def test_every_layers_outliers_are_named(lm, chat):
    found = outliers_by_layer(chat)
    assert len(found) == lm.layers and all(len(row) == lm.kv_heads for row in found)
    assert found[18][2] == channels(chat, 18, 2).outliers
    assert sum(len(c) for row in found for c in row) > lm.layers  # more than one a layer, over the model
    x = torch.ones(1, 5, 8)
    x[0, 2, 3] = 10
    assert outliers_of(x) == [[3]]
