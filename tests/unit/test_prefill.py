"""A long message's chunks cover its tokens once, in order."""

from __future__ import annotations

from kvviz.prefill import chunks


def test_chunks_cover_the_tokens_once():
    assert chunks(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert chunks(4, 1024) == [range(0, 4)]
    assert chunks(0, 3) == []
