"""Token pieces and segment bookkeeping (tokenizer only, no forward passes)."""

from __future__ import annotations

from kvviz.transcript import Transcript, token_pieces


def test_pieces_are_faithful_for_emoji_and_specials(lm):
    text = "héllo 😀 world<|im_end|>"
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    pieces = token_pieces(lm.tokenizer, ids)
    assert len(pieces) == len(ids)
    assert pieces[-1] == "<|im_end|>"
    assert "".join(pieces[:3]) == "héllo"
    # the emoji spans two tokens: neither half is a character, both stay visible as byte escapes
    assert pieces[3] == " \\xf0\\x9f\\x98" and pieces[4] == "\\x80"


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
