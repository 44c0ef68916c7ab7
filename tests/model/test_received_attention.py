"""The attention each slot received, kept across cache versions in whole chunks of rows and extended (bundled model,
chunks of 64 rows so a short chat has several): equal bit for bit to the sum made from the first row, and started
again when an earlier commit is taken back."""

from __future__ import annotations

import torch

from kvviz.edit.edit import Edit
from kvviz.policies.candidates import received_attention
from kvviz.session import Session

CHUNK = 64
STORY = "The printing press spread across Europe within fifty years and the first newspapers followed. " * 8


def _fresh(session: Session, at: int) -> torch.Tensor:
    """The sum from the first row, nothing kept (what the session keeps is put back afterwards)."""
    kept = dict(session.memo.lasting)
    session.memo.lasting.clear()
    total = received_attention(session, at, slice(0, at), CHUNK)
    session.memo.lasting.clear()
    session.memo.lasting.update(kept)
    return total


def _counting(session: Session, monkeypatch) -> list[int]:
    """The first row of every chunk whose weights are recomputed."""
    firsts: list[int] = []
    weights = session.weights
    monkeypatch.setattr(session, "weights", lambda layer, start, stop: firsts.append(start) or weights(
        layer, start, stop))
    return firsts


def test_the_kept_sum_is_extended_and_equals_the_sum_from_the_first_row(lm, monkeypatch):
    session = Session(lm)
    session.add_user_turn(STORY + "What came first?")
    session.generate(4)
    at = len(session) - 1
    received_attention(session, at, slice(0, at), CHUNK)  # keeps the whole chunks
    kept = session.memo.lasting["received_attention"]
    assert kept.rows == at - at % CHUNK and kept.rows >= 2 * CHUNK
    session.generate(3)  # new cache versions: the kept sum stays
    at = len(session) - 1
    firsts = _counting(session, monkeypatch)
    extended = received_attention(session, at, slice(0, at), CHUNK)
    assert min(firsts) == kept.rows  # only the chunks after the kept ones were summed
    monkeypatch.undo()
    assert torch.equal(extended, _fresh(session, at))
    early = at - CHUNK - 5  # looking back before the kept rows: summed from the first row, the kept sum kept
    received_attention(session, at, slice(0, at), CHUNK)
    rows = session.memo.lasting["received_attention"].rows
    assert torch.equal(received_attention(session, early, slice(0, early), CHUNK), _fresh(session, early))
    assert session.memo.lasting["received_attention"].rows == rows > early


def test_a_commit_taken_back_starts_the_sum_again(lm, monkeypatch):
    session = Session(lm)
    session.add_user_turn(STORY + "Name three rivers of Africa.")
    session.generate(2)
    session.commit(Edit.evict([3, 5, 8]))  # hides these from the rows after it
    session.generate(CHUNK)  # more than a chunk of rows under the commit
    at = len(session) - 1
    received_attention(session, at, slice(0, at), CHUNK)
    assert session.memo.lasting["received_attention"].commits  # the commit is in force for kept rows
    session.generate(1)  # a later step: still valid, extended
    firsts = _counting(session, monkeypatch)
    at = len(session) - 1
    extended = received_attention(session, at, slice(0, at), CHUNK)
    assert min(firsts) > 0
    monkeypatch.undo()
    assert torch.equal(extended, _fresh(session, at))
    session.undo()  # the kept rows saw the commit: no longer what they see
    firsts = _counting(session, monkeypatch)
    again = received_attention(session, at, slice(0, at), CHUNK)
    assert min(firsts) == 0
    monkeypatch.undo()
    assert torch.equal(again, _fresh(session, at))
    assert not torch.equal(again, extended)  # the commit hid slots: the sums differ
