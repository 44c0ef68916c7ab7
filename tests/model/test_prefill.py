"""A long message prefilled in chunks equals one pass: logits, K/V, recorded weights, also with committed evictions
and on a windowed architecture; a chunk that fails (or is stopped) leaves the session as it was."""

from __future__ import annotations

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.prefill import chunks
from kvviz.session import Session
from tests.support.references import full_forward
from kvviz.tiny_sessions import tiny_pair
from tests.support.rounding import logit_rounding, residual_rounding, weight_rounding, worst_ratio

TEXT = "The quick brown fox jumps over the lazy dog, and the cache keeps every key it saw. " * 3


def _pair(lm, chunk: int) -> tuple[Session, Session]:
    one, chunked = Session(lm), Session(lm)
    one.prefill_chunk, chunked.prefill_chunk = 10**9, chunk
    return one, chunked


def _same(one: Session, chunked: Session) -> None:
    """Logits, K/V and recorded weights to the rounding of another batch shape (tests/support/rounding.py): the K/V of
    layer ℓ carry ℓ + 1 layers of it, the weights their scores' own."""
    config = one.lm.config
    assert one.transcript.ids == chunked.transcript.ids
    assert (one.logits - chunked.logits).abs().max().item() <= logit_rounding(config, one.logits)
    assert one.pending == chunked.pending
    for layer in range(one.lm.layers):
        for a, b in zip(one.layer_kv(layer), chunked.layer_kv(layer)):
            assert a.shape == b.shape and (a - b).abs().max().item() <= residual_rounding(config, a, layer + 1)
        rel = weight_rounding(config, layer, one.queries.layer(layer), one.layer_kv(layer)[0], one.lm.scaling)
        assert worst_ratio(chunked.weights(layer), one.weights(layer), rel) <= 1


def test_a_chunked_prefill_equals_one_pass_over_turns_and_committed_evictions(lm, eager_model):
    one, chunked = _pair(lm, 7)  # 7 does not divide the message: the last chunk is short
    for session in (one, chunked):
        session.add_user_turn(TEXT)
    reference = full_forward(eager_model, chunked.transcript.ids).logits[0, -1]  # no cache, no kvviz code
    assert (chunked.logits - reference).abs().max().item() <= logit_rounding(lm.config, reference)
    for session in (one, chunked):
        session.generate(3)
    _same(one, chunked)
    for session in (one, chunked):  # a committed eviction is hidden in every chunk of the next turn
        session.commit(Edit.evict(range(5, 15)))
        session.add_user_turn("And what did the fox do next? " * 4)
    _same(one, chunked)


def test_chunk_progress_counts_every_layer_of_every_chunk(lm):
    session, seen = Session(lm), []
    session.prefill_chunk = 16
    session.on_layer = lambda done, total: seen.append((done, total))
    session.add_user_turn(TEXT)
    parts = len(chunks(len(session), 16))
    assert parts > 2
    assert seen == [(done, parts * lm.layers) for done in range(parts * lm.layers)]


def test_a_chunk_that_fails_leaves_the_session_as_it_was(lm):
    session = Session(lm)
    session.prefill_chunk = 16
    session.add_user_turn("Remember the number 41.")
    session.generate(2)
    before = (len(session), session.cache.get_seq_length(), session.queries.length, session.pending, session.version)
    logits = session.logits.clone()

    def stop(done: int, total: int) -> None:
        if done == 2 * lm.layers + 3:  # inside the third chunk
            raise KeyboardInterrupt

    session.on_layer = stop
    with pytest.raises(KeyboardInterrupt):
        session.add_user_turn(TEXT)
    session.on_layer = None
    assert (len(session), session.cache.get_seq_length(), session.queries.length, session.pending,
            session.version) == before
    assert torch.equal(session.logits, logits)
    fresh = Session(lm)
    fresh.prefill_chunk = 10**9
    for s in (session, fresh):
        if s is fresh:
            s.add_user_turn("Remember the number 41.")
            s.generate(2)
        s.add_user_turn(TEXT)
    _same(fresh, session)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_a_chunked_prefill_equals_one_pass_on_windowed_and_soft_capped_models(lm, family):
    tiny, eager, _ = tiny_pair(family, lm.tokenizer, [])
    one, chunked = _pair(tiny, 5)
    ids = list(range(3, 43))  # longer than the tiny models' 16-slot windows
    for session in (one, chunked):
        session.add_ids(ids)
    _same(one, chunked)
    reference = full_forward(eager, ids).logits[0, -1]
    assert (chunked.logits - reference).abs().max().item() <= logit_rounding(tiny.config, reference)
