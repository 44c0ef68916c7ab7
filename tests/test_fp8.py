"""FP8 caches (e4m3, e5m2), as vLLM and SGLang store them: each quantized group scaled to its largest value, cast with
torch's own float8 casts, scaled back — against references built here from those casts, on synthetic tensors (the
round trip) and on the bundled model (a what-if against a cache holding the test's own FP8 K/V, commits replayed from
a session file).

Tolerances. The round trip is compared exactly: the test runs the same float32 division, cast and multiplication.
The what-if against the built cache differs only in summation order: probabilities within (e^{2ε} − 1)·p, ε the
logits' rounding (tests/support/rounding.py).
"""

from __future__ import annotations

import pytest
import torch

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from tests.support.error_bounds import error_bound
from kvviz.quant.quantizer import Quantizer, fake_quantize, packed_bytes
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if
from tests.support.references import assert_what_if_is_the_stored_cache

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
DIMS = {"head": (1, 2), "channel": 1, "tensor": (0, 1, 2)}
PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"


def reference(x: torch.Tensor, fmt: str, axis: str) -> torch.Tensor:
    """``x`` ``(KV, n, D)`` through an FP8 cache: per group ``scale = amax / max``, torch's cast, back."""
    dtype = DTYPES[fmt]
    if axis == "token":
        scale = x.abs().amax(-1, keepdim=True) / torch.finfo(dtype).max
    else:
        scale = x.abs().amax(DIMS[axis], keepdim=True) / torch.finfo(dtype).max
    return (x / scale).to(dtype).float() * scale


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("axis", ["head", "token", "channel", "tensor"])
def test_the_round_trip_is_torchs_own_fp8_cast(fmt, axis):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 40, 64, generator=generator) * torch.rand(3, 1, 64, generator=generator) * 30
    x[0, 5, 7] = 4000.0  # an outlier sets its group's scale
    quantizer = Quantizer(axis=axis, format=fmt)
    out = fake_quantize(x, 8, quantizer)
    assert torch.equal(out, reference(x, fmt, axis))
    assert bool(((out - x).abs() <= error_bound(x, 8, quantizer)).all())
    assert not torch.equal(out, x) and float((out - x).abs().max()) > 0
    zeros = torch.zeros(3, 4, 64)
    assert torch.equal(fake_quantize(zeros, 8, quantizer), zeros)  # a group of zeros comes back as zeros


def test_fp8_bytes_are_one_per_element_and_a_float32_scale_per_group():
    head, token = Quantizer(axis="head", format="e4m3"), Quantizer(axis="token", format="e5m2")
    assert packed_bytes(100, 8, 64, head, 2) == 100 * 64 + 4
    assert packed_bytes(100, 8, 64, token, 2) == 100 * 64 + 100 * 4
    assert packed_bytes(100, 8, 64, Quantizer(axis="channel", format="e4m3"), 2) == 100 * 64 + 64 * 4
    assert packed_bytes(100, 8, 64, Quantizer(axis="tensor", format="e4m3"), 2) == 100 * 64  # its scale: per layer


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT)


@pytest.mark.parametrize("fmt, axis", [("e4m3", "head"), ("e5m2", "head"), ("e4m3", "tensor")])
def test_an_fp8_what_if_equals_a_cache_holding_fp8_values(lm, chat, fmt, axis):
    at = len(chat) - 1
    edit = Edit.quantize(range(at), 8, keys=Quantizer(axis, format=fmt), values=Quantizer(axis, format=fmt))
    tensors = [tuple(reference(t[0, :, :at].float(), fmt, axis)[None] for t in kv_cache.layer_kv(chat.cache, layer))
               for layer in range(lm.layers)]
    result = what_if(chat, edit, at=at, topk=20)
    assert_what_if_is_the_stored_cache(chat, result, tensors)
    assert result.next_token.kl > 0
    scales = lm.layers * 2 * 4 * (lm.kv_heads if axis == "head" else 1)  # float32 scales: per KV head or per layer
    assert result.memory.edited_bytes == lm.layers * lm.kv_heads * 2 * at * lm.head_dim + scales
    untouched = Edit(keys=Quantizer(axis, format=fmt), values=Quantizer(axis, format=fmt))
    assert what_if(chat, untouched, at=at).next_token.kl == 0


def test_fp8_commits_replay_from_a_session_file_and_bad_widths_are_refused(lm):
    session = Session(lm)
    session.add_user_turn(PROMPT)
    keys = Quantizer("head", format="e4m3")
    session.commit(Edit.quantize(range(len(session) - 1), 8, keys=keys, values=Quantizer("token", format="e5m2")))
    session.generate(3)
    restored, _, _ = import_session(lm, export_session(session))
    assert restored.commits.stack == session.commits.stack
    assert torch.equal(restored.logits, session.logits)
    before = [t.clone() for t in session.layer_kv(0)]
    with pytest.raises(KvvizError, match="FP8 \\(e4m3\\) stores 8 bits per element"):
        session.commit(Edit.quantize([1, 2], 4, keys=keys))
    assert len(session.commits.stack) == 1 and all(torch.equal(a, b) for a, b in zip(session.layer_kv(0), before))


def test_the_page_quantizes_to_fp8_and_refuses_other_widths_in_one_line():
    import re

    from tests.support.app_test import assert_clean, metric, start

    app = start()
    app.session_state["max_new_tokens"] = 4
    for message in ("Name three colours.", "And two more?"):
        app.chat_input[0].set_value(message).run()
    app.selectbox(key="number_format").set_value("e4m3").run()
    app.selectbox(key="key_axis").set_value("head").run()
    app.selectbox(key="pick_k").set_value(8).run()
    app.selectbox(key="pick_v").set_value(8).run()
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert_clean(app)
    draft = app.session_state["draft"]
    assert draft.keys == Quantizer("head", format="e4m3") and set(draft.key_bits.values()) == {8}
    assert float(metric(app, "KL")) > 0
    app.selectbox(key="pick_k").set_value(4).run()
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert_clean(app)
    assert any("stores 8 bits per element" in re.sub(r"\\(.)", r"\1", w.value) for w in app.warning)
