"""The 2026 cache formats on the bundled model: NVFP4 and MXFP4 round trips of the model's own K/V against torchao's
(tests/support/torchao_reference.py), a what-if with each scheme against a step on a cache holding the test's own
quantized K/V, bytes that count every scale, and layers kept in 16 bits by rule.

Tolerances. The round trips are compared bit for bit (elementwise, correctly rounded float32 operations). The what-if
against the built cache differs only in summation order: probabilities within (e^{2ε} − 1)·p
(tests/support/rounding.py)."""

from __future__ import annotations

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.schemes.catalogue import Scheme, schemes
from kvviz.quant.quantizer import Quantizer, fake_quantize, packed_bytes
from kvviz.session import Session
from kvviz.whatif import what_if
from kvviz.schemes.compare import compare_schemes, scheme_edits
from kvviz.whatif.memory import step_memory
from tests.support import torchao_reference as ao
from tests.support.references import assert_what_if_is_the_stored_cache

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, steps=3)


def test_the_round_trip_of_the_models_own_keys_and_values_is_torchaos(chat):
    for layer in (0, 14, 29):
        keys, values = chat.commits.step_kv(layer, len(chat) - 1)  # (KV, n, D) float32
        for x in (keys, values):
            rows = x.reshape(-1, x.shape[-1])
            assert torch.equal(fake_quantize(x, 4, Quantizer("token", format="nvfp4")), ao.nvfp4(rows).view(x.shape))
            assert torch.equal(fake_quantize(x, 4, Quantizer("token", format="mxfp4")), ao.mxfp4(rows).view(x.shape))


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "k8v4-token-head", "int4-token-head+skip-first2+skip-9,20"])
def test_a_what_if_with_the_scheme_is_a_step_on_a_cache_holding_the_tests_own_rounding(chat, name):
    at = len(chat) - 1
    scheme = Scheme(name)
    edit = scheme_edits(chat, [scheme], at)[0]
    tensors = []
    for layer in range(chat.lm.layers):
        keys, values = chat.commits.step_kv(layer, at)
        if layer not in scheme.exact_layers((None,) * chat.lm.layers):
            keys, values = own_rounding(name, keys), own_rounding(name, values, value=True)
        tensors.append((keys[None], values[None]))
    result = what_if(chat, edit, at)
    assert result.next_token.kl > 0
    assert_what_if_is_the_stored_cache(chat, result, tensors)


def own_rounding(name: str, x: torch.Tensor, value: bool = False) -> torch.Tensor:
    """``x`` ``(KV, n, D)`` as the test rounds it for scheme ``name``: torchao for the FP4 formats, the loop's
    symmetric per-token-head codes for the others (keys at 8 bits and values at 4 for k8v4)."""
    rows = x.reshape(-1, x.shape[-1])
    if name == "nvfp4":
        return ao.nvfp4(rows).view(x.shape)
    if name == "mxfp4":
        return ao.mxfp4(rows).view(x.shape)
    bits = 4 if value or name.startswith("int4") else 8
    scale = (x.abs().amax(-1, keepdim=True) / (2 ** (bits - 1) - 1)).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(x / scale) * scale


def test_the_bytes_count_every_scale(chat):
    at = len(chat) - 1
    lm = chat.lm
    for name, per_head in [("nvfp4", 64 // 2 + 64 // 16), ("mxfp4", 64 // 2 + 64 // 32), ("int4-token-head", 32 + 4),
                           ("k8v4-token-head", None), ("fp8-token-head", 64 + 4)]:
        edit = scheme_edits(chat, [Scheme(name)], at)[0]
        memory = step_memory(chat, edit, at)
        if per_head is None:  # keys: 64 one-byte codes and a scale; values: 32 bytes of codes and a scale
            expected = at * lm.layers * lm.kv_heads * ((64 + 4) + (32 + 4))
        else:
            expected = 2 * at * lm.layers * lm.kv_heads * per_head + (2 * 4 * lm.layers if name == "nvfp4" else 0)
        assert memory.edited_bytes == expected
        assert packed_bytes(at, 4, 64, Quantizer("token", format="nvfp4"), 2) == at * 36
    nvfp4 = step_memory(chat, scheme_edits(chat, [Scheme("nvfp4")], at)[0], at)
    assert nvfp4.fp16_bytes / nvfp4.edited_bytes == pytest.approx(128 / 36, rel=1e-3)  # not 4×: the scales count


def test_layers_kept_exact_cost_their_16_bits_and_are_left_as_they_are(chat):
    at = len(chat) - 1
    lm = chat.lm
    edit = scheme_edits(chat, [Scheme("int8-token-head+skip-last3")], at)[0]
    assert edit.exact_layers == (27, 28, 29)
    memory = step_memory(chat, edit, at)
    quantized = 2 * at * (lm.layers - 3) * lm.kv_heads * (64 + 4)
    native = torch.empty((), dtype=lm.dtype).element_size()  # an untouched slot stays at the model's dtype
    assert memory.edited_bytes == quantized + 2 * at * 3 * lm.kv_heads * 64 * native
    keys, values = chat.commits.step_kv(28, at)
    assert all(torch.equal(a, b) for a, b in zip(edit.quantized(keys, values, 28), (keys, values)))
    assert not torch.equal(edit.quantized(keys, values, 2)[0], keys)
    assert Edit.from_dict(edit.to_dict()) == edit


@pytest.mark.parametrize("names, message", [
    (["nvfp4+skip-sliding"], "no sliding-window layer"),
    (["nvfp4+skip-40"], "layer 40 does not exist"),
    (["int4-token-head+skip-first30"], "nothing would be quantized"),
    (["int3-token-head"], "unknown quantization scheme 'int3-token-head'"),
    (["k8v3-token-head"], "unknown quantization scheme"),
    (["kivi-2+skip-first2"], "layers kept in 16 bits are"),
    (["nvfp4+hadamard"], "an int or fp8 scheme takes"),
])
def test_bad_combinations_are_refused_in_one_line_and_change_nothing(chat, names, message):
    before = (chat.version, len(chat), chat.commits.current.key)
    with pytest.raises(KvvizError, match=message) as refusal:
        compare_schemes(chat, schemes(names))
    assert "\n" not in str(refusal.value)
    assert (chat.version, len(chat), chat.commits.current.key) == before


def test_sliding_window_layers_kept_exact_and_a_block_too_wide_for_the_head_refused(lm):
    """A tiny Gemma 3 (two sliding-window layers of three, heads of 16 channels): ``+skip-sliding`` keeps layers 0
    and 1 exact; MXFP4's blocks of 32 do not fit its heads, refused before any scheme runs."""
    from kvviz.tiny_sessions import tiny_pair

    _, _, session = tiny_pair("gemma3", lm.tokenizer, ["hello there"], new_tokens=3)
    at = len(session) - 1
    edit = scheme_edits(session, [Scheme("nvfp4+skip-sliding")], at)[0]
    assert edit.exact_layers == (0, 1)
    row = compare_schemes(session, schemes(["nvfp4+skip-sliding", "mxfp4-b16"]))[0]
    assert row.quantized == at and row.kl >= 0
    version, length = session.version, len(session)
    with pytest.raises(KvvizError, match="group size 32 does not divide the head dimension 16"):
        compare_schemes(session, schemes(["nvfp4", "mxfp4"]))
    assert (session.version, len(session)) == (version, length)


def test_a_committed_nvfp4_edit_with_layers_kept_exact_replays_from_a_session_file(lm, make_chat):
    from kvviz.session_file import export_session, import_session

    session = make_chat(PROMPT, steps=1)
    at = len(session) - 1
    edit = scheme_edits(session, [Scheme("nvfp4+skip-first2")], at)[0]
    session.commit(edit)
    session.generate(3)
    restored, _, _ = import_session(lm, export_session(session))
    assert restored.commits.stack == session.commits.stack
    assert restored.commits.current.exact_layers == (0, 1) and restored.commits.current.keys.format == "nvfp4"
    assert torch.equal(restored.logits, session.logits)
    token_head = scheme_edits(session, [Scheme("k8v4-token-head")], len(session) - 1)[0]
    assert Edit.from_dict(token_head.to_dict()) == token_head and token_head.keys.fp32_scales
