"""Outlier-aware schemes on the bundled model: a what-if against a cache holding the test's own K/V (probabilities
within (e^{2ε} − 1)·p, tests/support/rounding.py), two-bit keys helped by the rotation and the kept channels, and
session files replaying outlier edits."""

from __future__ import annotations

import pytest
import torch

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.quant.quantizer import Quantizer, hadamard
from kvviz.schemes.catalogue import schemes
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if
from tests.support.references import assert_what_if_is_the_stored_cache

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my cat called?"


def min_max(x: torch.Tensor, bits: int, dim) -> torch.Tensor:
    """The asymmetric min/max round trip, written out: (x − low)/scale rounded, back."""
    low = x.amin(dim, keepdim=True)
    scale = ((x.amax(dim, keepdim=True) - low) / (2**bits - 1)).clamp_min(torch.finfo(torch.float32).tiny)
    return ((x - low) / scale).round() * scale + low


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT)


@pytest.mark.parametrize("quantizer", [Quantizer("token", rotation="hadamard"), Quantizer("channel", outliers=4)])
def test_a_what_if_equals_a_cache_holding_the_tests_own_kv(lm, chat, quantizer):
    at = len(chat) - 1
    keys = values = quantizer
    edit = Edit.quantize(range(at), 2, keys=keys, values=values)
    dims = -1 if quantizer.axis == "token" else 1
    h = hadamard(lm.head_dim)

    def stored(x: torch.Tensor) -> torch.Tensor:  # (KV, n, D) as the test stores it
        if quantizer.rotation == "hadamard":
            return min_max(x @ h, 2, dims) @ h
        out = x.clone()
        for head in range(x.shape[0]):
            peaks = x[head].abs().amax(0).tolist()
            rest = sorted(sorted(range(x.shape[-1]), key=lambda c: (-peaks[c], c))[quantizer.outliers:])
            out[head][:, rest] = min_max(x[head:head + 1][:, :, rest], 2, dims)[0]
        return out

    tensors = [tuple(stored(t[0, :, :at].float())[None] for t in kv_cache.layer_kv(chat.cache, layer))
               for layer in range(lm.layers)]
    assert_what_if_is_the_stored_cache(chat, what_if(chat, edit, at=at, topk=20), tensors)


def test_outlier_schemes_help_two_bit_keys_on_the_bundled_model(chat):
    """KIVI's observation on this model: per-token 2-bit keys suffer from the outlier channels; keeping 4 of them
    exact, or rotating them away, cuts the damage to the step."""
    from kvviz.schemes.compare import compare_schemes

    plain, rotated, kept = compare_schemes(chat, schemes(["int2-token", "int2-token+hadamard", "int2-token+outliers4"]))
    assert rotated.kl < plain.kl and kept.kl < plain.kl
    assert kept.bytes > plain.bytes == rotated.bytes


def test_outlier_edits_replay_from_a_session_file(make_chat, lm):
    session = make_chat(PROMPT)
    session.commit(Edit.quantize(range(len(session) - 1), 2, keys=Quantizer("channel", outliers=3),
                                 values=Quantizer("token", rotation="hadamard")))
    session.generate(3)
    restored, _, _ = import_session(lm, export_session(session))
    assert restored.commits.stack == session.commits.stack
    assert torch.equal(restored.logits, session.logits)
