"""The 2026 cache formats: NVFP4 (and its 4-over-6 scale choice), MXFP4 (blocks of 32, and SGLang's blocks of 16), the
per-token-head int / FP8 caches (keys and values at different widths), and layers kept in 16 bits by rule.

References: torchao's ``NVFP4Tensor`` / ``MXTensor`` round trips (tests/support/torchao_reference.py) on random
tensors and on the bundled model's K/V; loops written here for 4-over-6 and per-token-head; a step on a cache holding
the test's own quantized K/V for the what-if.

Tolerances. The round trips are compared bit for bit: every operation is elementwise and correctly rounded in IEEE
float32 (division, multiplication, casts, ``round``), and the maxima are exact, so no summation order enters — except
4-over-6's choice, which compares two sums of 16 squared errors: where those differ by less than their float32
rounding (16 terms: 16·u relative) either candidate is right. The what-if against the built cache differs only in
summation order: probabilities within (e^{2ε} − 1)·p (tests/support/rounding.py).
"""

from __future__ import annotations

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.quant.catalogue import Scheme, schemes
from kvviz.quant.fp4 import e2m1_
from kvviz.quant.quantizer import Quantizer, fake_quantize, packed_bytes
from kvviz.session import Session
from kvviz.whatif import what_if
from kvviz.whatif.compare_schemes import compare_schemes, scheme_edits
from kvviz.whatif.memory import step_memory
from tests.support import torchao_reference as ao
from tests.support.references import assert_what_if_is_the_stored_cache

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def random_kv(seed: int, scale: float) -> torch.Tensor:
    """``(3, 40, 64)`` float32 with channels of different magnitudes, a zero block and an outlier."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 40, 64, generator=generator) * torch.rand(3, 1, 64, generator=generator) * scale
    x[1, 3, :32] = 0.0
    x[2, 7, 5] = 40 * scale
    return x


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, steps=3)


def test_e2m1_rounds_to_the_nearest_value_ties_to_an_even_mantissa():
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -5.0, 0.26, 4.99])
    assert e2m1_(midpoints.clone()).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, -4.0, 0.5, 4.0]
    grid = torch.tensor(E2M1 + [-v for v in E2M1])
    assert torch.equal(e2m1_(grid.clone()), grid)


@pytest.mark.numeric
@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
@pytest.mark.parametrize("name, reference", [("nvfp4", ao.nvfp4), ("mxfp4", ao.mxfp4),
                                             ("mxfp4-b16", lambda x: ao.mxfp4(x, 16))])
def test_the_round_trip_is_torchaos_bit_for_bit(name, reference, scale):
    x = random_kv(3, scale)
    quantizer = schemes([name])[0].edit([40], 40).keys
    out = fake_quantize(x, 4, quantizer)
    assert torch.equal(out, reference(x.reshape(-1, 64)).reshape(x.shape))
    assert not torch.equal(out, x)


@pytest.mark.numeric
def test_the_round_trip_of_the_models_own_keys_and_values_is_torchaos(chat):
    for layer in (0, 14, 29):
        keys, values = chat.commits.step_kv(layer, len(chat) - 1)  # (KV, n, D) float32
        for x in (keys, values):
            rows = x.reshape(-1, x.shape[-1])
            assert torch.equal(fake_quantize(x, 4, Quantizer("token", format="nvfp4")), ao.nvfp4(rows).view(x.shape))
            assert torch.equal(fake_quantize(x, 4, Quantizer("token", format="mxfp4")), ao.mxfp4(rows).view(x.shape))


def four_over_six(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The test's loop: per block of 16, NVFP4 with the block's largest value mapped to 6 and to 4 (torchao's order
    of operations); returns both candidates and the float64 squared error of each, per block."""
    tensor = x.abs().max() / (448 * 6)
    candidates = []
    for target in (6.0, 4.0):
        out = torch.empty_like(x)
        for row in range(x.shape[0]):
            for start in range(0, x.shape[1], 16):
                block = x[row, start:start + 16]
                scale = (block.abs().max() / target / tensor).clamp(2.0**-6, 448).to(torch.float8_e4m3fn).float()
                out[row, start:start + 16] = e2m1_(block * ((1.0 / tensor) / scale)) * (tensor * scale)
        candidates.append(out)
    errors = [(c.double() - x.double()).square().view(x.shape[0], -1, 16).sum(-1) for c in candidates]
    return *candidates, torch.stack(errors)


@pytest.mark.numeric
def test_four_over_six_keeps_per_block_the_scale_that_errs_less():
    x = random_kv(5, 2.0).reshape(-1, 64)
    out = fake_quantize(x[None], 4, Quantizer("token", format="nvfp4-4over6"))[0]
    six, four, errors = four_over_six(x)
    blocks = lambda t: t.view(x.shape[0], -1, 16)  # noqa: E731
    clear = (errors[0] - errors[1]).abs() > 16 * 2.0**-24 * errors.amax(0)  # not a tie within float32 rounding
    chosen = torch.where((errors[1] < errors[0])[..., None], blocks(four), blocks(six))
    assert torch.equal(blocks(out)[clear], chosen[clear])
    tied = blocks(out)[~clear]
    candidates = zip(tied, blocks(six)[~clear], blocks(four)[~clear])
    assert all(torch.equal(b, s) or torch.equal(b, f) for b, s, f in candidates)
    assert bool((errors[1] < errors[0]).any() and (errors[0] < errors[1]).any())  # both choices happen
    assert (out - x).square().sum() < (six - x).square().sum()


@pytest.mark.numeric
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_int_per_token_head_is_one_symmetric_float32_scale_per_slot_and_head(bits):
    x = random_kv(7, 3.0)
    out = fake_quantize(x, bits, Quantizer("token", symmetric=True, fp32_scales=True))
    top = 2 ** (bits - 1) - 1
    for head in range(x.shape[0]):
        for slot in range(x.shape[1]):
            row = x[head, slot]
            scale = (row.abs().max() / top).clamp(min=torch.finfo(torch.float32).tiny)
            assert torch.equal(out[head, slot], torch.round(row / scale) * scale)


@pytest.mark.numeric
def test_fp8_per_token_head_is_one_float32_scale_per_slot_and_head():
    x = random_kv(8, 3.0)
    out = fake_quantize(x, 8, Scheme("fp8-token-head").edit([40], 40).keys)
    for head in range(x.shape[0]):
        for slot in range(x.shape[1]):
            row = x[head, slot]
            scale = row.abs().max() / 448
            assert torch.equal(out[head, slot], (row / scale).to(torch.float8_e4m3fn).float() * scale)


@pytest.mark.numeric
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
    from kvviz.tiny_models import tiny_pair

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


def test_a_block_that_does_not_divide_the_head_dimension_is_refused():
    x = torch.randn(2, 4, 24)
    with pytest.raises(KvvizError, match="group size 16 does not divide the head dimension 24"):
        fake_quantize(x, 4, Quantizer("token", format="nvfp4"))
    with pytest.raises(KvvizError, match="stores 4 bits per element"):
        fake_quantize(torch.randn(2, 4, 32), 8, Quantizer("token", format="mxfp4"))
    with pytest.raises(KvvizError, match="axis 'token'"):
        Quantizer("channel", format="nvfp4")


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


def test_the_strips_bit_picker_rounds_to_nvfp4_and_refuses_other_axes_in_one_line():
    import re

    from kvviz.quant.quantizer import Quantizer
    from tests.support.app_test import assert_clean, metric, start

    app = start()
    app.session_state["max_new_tokens"] = 4
    for message in ("Name three colours.", "And two more?"):  # history to round
        app.chat_input[0].set_value(message).run()
    app.selectbox(key="number_format").set_value("nvfp4").run()
    assert any("axis 'token'" in re.sub(r"\\(.)", r"\1", w.value) for w in app.warning)  # keys per channel: refused
    app.selectbox(key="key_axis").set_value("token").run()
    assert_clean(app)
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert_clean(app)
    draft = app.session_state["draft"]
    assert draft.keys == draft.values == Quantizer("token", format="nvfp4") and set(draft.key_bits.values()) == {4}
    assert float(metric(app, "KL")) > 0
