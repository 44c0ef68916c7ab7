"""Segment bookkeeping follows the newest turn (no forward pass)."""

from __future__ import annotations

from kvviz.transcript import Transcript


def test_segments_follow_the_newest_turn():
    transcript = Transcript()
    transcript.turn = 0
    transcript.append([1, 2, 3], ["a", "b", "c"], "prefill")
    transcript.append([4], ["d"], "decode")
    assert transcript.segments() == ["query"] * 3 + ["generated"]
    transcript.turn = 1
    transcript.append([5, 6], ["e", "f"], "prefill")
    assert transcript.segments() == ["history"] * 4 + ["query"] * 2
    assert [g.length for g in transcript.growth] == [3, 4, 6]
    assert (transcript.growth[-1].history, transcript.growth[-1].query) == (4, 2)
    assert transcript.next_position == 6
