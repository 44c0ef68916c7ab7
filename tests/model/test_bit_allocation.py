"""Mixed precision across layers and KV heads (``Edit.head_widths``, kvviz.quant.allocation, schemes ``mix{B}-{rule}``)
on the bundled model: a uniform allocation is the plain scheme of that width (the same logits and bytes), a mixed one
equals a cache holding the test's own K/V quantized head by head, its bytes a plain loop over the pairs, and the
``keyerror`` rule a reference loop written here.

Tolerances. Quantizing one KV head alone or beside others runs the same float32 operations on the same row (per
channel and per token, scales never span KV heads), so the test's K/V are compared exactly; the what-if against the
stored cache differs only in summation order (tests/support/references.py). Key errors are float64 sums of float32 terms, used
only to order the pairs, as the library orders them.
"""

from __future__ import annotations

import json

import pytest
import torch

from kvviz import kv_cache
from kvviz.quant.allocation import WIDTHS, allocate, key_errors
from kvviz.cli import main
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, fake_quantize, packed_bytes
from kvviz.schemes.catalogue import Scheme, schemes
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if
from kvviz.schemes.compare import compare_schemes, scheme_edits
from tests.support.references import assert_what_if_is_the_stored_cache

PROMPT = "My dog is called Rex and my cat is called Whiskers. The cat sleeps on the red sofa. What is my dog called?"


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, generate=3)


def test_a_uniform_allocation_is_the_plain_scheme_of_its_width(chat):
    rows = compare_schemes(chat, schemes(["int3-channel", "mix3-uniform", "int2-channel", "mix2-uniform"]))
    for plain, mixed in (rows[:2], rows[2:]):
        assert (mixed.kl, mixed.bytes, mixed.delta_o) == (plain.kl, plain.bytes, plain.delta_o)
    at = len(chat) - 1
    untouched = Edit.quantize(range(at), 2, head_widths=((16,) * chat.lm.kv_heads,) * chat.lm.layers)
    assert what_if(chat, untouched, at=at).next_token.kl == 0  # every pair at 16 bits: the identity


def test_a_mixed_what_if_equals_a_cache_quantized_head_by_head(lm, chat):
    at = len(chat) - 1
    widths = tuple(tuple(WIDTHS[(layer + head) % 3] for head in range(lm.kv_heads)) for layer in range(lm.layers))
    keys_q, values_q = Quantizer("channel"), Quantizer("token")
    edit = Edit.quantize(range(at), 2, keys=keys_q, values=values_q, head_widths=widths)
    tensors = []
    for layer in range(lm.layers):
        own = []
        for t, quantizer in zip(kv_cache.layer_kv(chat.cache, layer), (keys_q, values_q)):
            heads = [fake_quantize(t[0, head:head + 1, :at].float(), widths[layer][head], quantizer)
                     for head in range(lm.kv_heads)]
            own.append(torch.cat(heads)[None])
        tensors.append(tuple(own))
    result = what_if(chat, edit, at=at, topk=20)
    assert_what_if_is_the_stored_cache(chat, result, tensors)
    native = torch.empty((), dtype=lm.dtype).element_size()
    expected = sum(packed_bytes(at, widths[layer][head], lm.head_dim, quantizer, native)
                   for layer in range(lm.layers) for head in range(lm.kv_heads) for quantizer in (keys_q, values_q))
    assert result.memory.edited_bytes == expected


def test_the_keyerror_rule_is_a_greedy_climb_of_the_worst_keys(lm, chat):
    at, average = len(chat) - 1, 2.6
    keys = [chat.commits.step_kv(layer, at)[0] for layer in range(lm.layers)]  # (KV, at, D)
    errors = key_errors(keys, Quantizer("channel"))
    widths = [[WIDTHS[0]] * lm.kv_heads for _ in range(lm.layers)]
    spare = average * lm.layers * lm.kv_heads - WIDTHS[0] * lm.layers * lm.kv_heads
    while True:  # the reference: of the pairs whose next width fits, the one whose keys lose most climbs
        fits = [(float(errors[widths[l][h]][l, h]), -l, -h) for l in range(lm.layers) for h in range(lm.kv_heads)
                if widths[l][h] != WIDTHS[-1] and WIDTHS[WIDTHS.index(widths[l][h]) + 1] - widths[l][h] <= spare]
        if not fits:
            break
        _, l, h = max(fits)
        step = WIDTHS[WIDTHS.index(widths[-l][-h]) + 1] - widths[-l][-h]
        widths[-l][-h] += step
        spare -= step
    chosen = allocate(keys, average, "keyerror", Quantizer("channel"))
    assert chosen == tuple(tuple(row) for row in widths)
    assert sum(map(sum, chosen)) <= average * lm.layers * lm.kv_heads and len({w for r in chosen for w in r}) > 1
    row = compare_schemes(chat, schemes(["mix2.6-keyerror"]))[0]
    assert row.bytes < compare_schemes(chat, schemes(["int3-channel"]))[0].bytes


def test_widths_per_head_that_cannot_hold_are_refused_in_one_line(lm, chat):
    at, version = len(chat) - 1, chat.version
    fits = ((3,) * lm.kv_heads,) * lm.layers
    keys = [chat.commits.step_kv(layer, at)[0] for layer in range(lm.layers)]
    refusals = [
        (lambda: allocate(keys, 2.5, "uniform", Quantizer("channel")), "needs a width"),
        (lambda: allocate(keys, 9, "keyerror", Quantizer("channel")), "outside the widths"),
        (lambda: allocate(keys, 3, "best", Quantizer("channel")), "rule is one of"),
        (lambda: Edit(head_widths=((3, 5),)), "bit-width must be one of"),
        (lambda: what_if(chat, Edit.quantize(range(at), 2, head_widths=((3,) * lm.kv_heads,) * 2), at), "2 layers of 3"),
        (lambda: what_if(chat, Edit.quantize(range(at), 2, keys=Quantizer("tensor"), head_widths=fits), at),
         "per channel, token or KV head"),
        (lambda: Scheme("mix3-keyerror").edit([at + 1], at), "needs its widths"),
        (lambda: Scheme("mix9-uniform"), "unknown quantization scheme"),
    ]
    for attempt, message in refusals:
        with pytest.raises(KvvizError, match=message) as caught:
            attempt()
        assert "\n" not in str(caught.value)
    assert chat.version == version
    assert main(["whatif", "--turn", PROMPT, "--scheme", "mix3-uniform", "--pre-rope"]) == 2  # a scheme takes +prerope


def test_a_committed_mixed_edit_replays_from_its_session_file(make_chat, lm, chat):
    session = make_chat(PROMPT)
    edit = scheme_edits(session, [Scheme("mix2.5-keyerror")], len(session))[0]
    session.commit(edit)
    session.generate(3)
    restored, _, _ = import_session(lm, json.loads(json.dumps(export_session(session))))
    assert restored.commits.stack == session.commits.stack
    assert torch.equal(restored.logits, session.logits)


def test_quant_compare_prints_a_mixed_scheme(capsys):
    code = main(["quant-compare", "--turn", PROMPT, "--max-new-tokens", "2", "--scheme", "mix3-uniform",
                 "--scheme", "mix3-keyerror", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["scheme"] for r in rows] == ["mix3-uniform", "mix3-keyerror"] and rows[0]["bytes"] == rows[1]["bytes"]


@pytest.mark.parametrize("scheme", ["mix2.5-keyerror", "fp8-e4m3-head-static", "int2-channel+prerope"])
def test_an_eviction_on_top_of_a_committed_quantization_keeps_it(make_chat, lm, scheme):
    """The edited run of an eviction after a commit sees the committed quantization as it was: its probabilities
    equal those of one uncommitted edit holding both (the same cache, so the same float32 operations: exact)."""
    session = make_chat(PROMPT)
    committed = scheme_edits(session, [Scheme(scheme)], len(session))[0]
    session.commit(committed)
    session.step()  # the step right after the commit: the slots before it are as computed in both sessions
    at = len(session) - 1
    on_top = what_if(session, Edit.evict([20, 21]), at=at, topk=10)
    fresh = make_chat(PROMPT)
    fresh.step()
    both = what_if(fresh, committed.merged(Edit.evict([20, 21])), at=at, topk=10)
    assert [(c.id, c.prob) for c in on_top.next_token.edited] == [(c.id, c.prob) for c in both.next_token.edited]
    session.commit(Edit.evict([20, 21]))  # committed too, the earlier quantization stays as it was
    current = session.commits.current
    assert (current.keys, current.values, current.head_widths) == (committed.keys, committed.values,
                                                                   committed.head_widths)
