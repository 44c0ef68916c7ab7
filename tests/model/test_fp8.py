"""FP8 caches (e4m3, e5m2) on the bundled model, as vLLM and SGLang store them: a what-if against a cache holding the
test's own FP8 K/V (each group scaled to its largest value, torch's own float8 cast, scaled back), and FP8 commits
replayed from a session file.

Tolerances. The what-if against the built cache differs only in summation order: probabilities within
(e^{2ε} − 1)·p, ε the logits' rounding (tests/support/rounding.py)."""

from __future__ import annotations

import pytest
import torch

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if
from tests.support.references import assert_what_if_is_the_stored_cache
from tests.support.references import fp8_round_trip

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT)


@pytest.mark.parametrize("fmt, axis", [("e4m3", "head"), ("e5m2", "head"), ("e4m3", "tensor")])
def test_an_fp8_what_if_equals_a_cache_holding_fp8_values(lm, chat, fmt, axis):
    at = len(chat) - 1
    edit = Edit.quantize(range(at), 8, keys=Quantizer(axis, format=fmt), values=Quantizer(axis, format=fmt))
    tensors = [tuple(fp8_round_trip(t[0, :, :at].float(), fmt, axis)[None] for t in kv_cache.layer_kv(chat.cache, layer))
               for layer in range(lm.layers)]
    result = what_if(chat, edit, at=at, topk=20)
    assert_what_if_is_the_stored_cache(chat, result, tensors)
    assert result.next_token.kl > 0
    scales = lm.layers * 2 * 4 * (lm.kv_heads if axis == "head" else 1)  # float32 scales: per KV head or per layer
    assert result.memory.edited_bytes == lm.layers * lm.kv_heads * 2 * at * lm.head_dim + scales
    untouched = Edit(keys=Quantizer(axis, format=fmt), values=Quantizer(axis, format=fmt))
    assert what_if(chat, untouched, at=at).next_token.kl == 0


def test_fp8_commits_replay_from_a_session_file_and_bad_widths_are_refused(make_chat, lm):
    session = make_chat(PROMPT)
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
