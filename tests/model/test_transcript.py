"""Token pieces are faithful for emoji and special tokens on the bundled model's tokenizer and session."""

from __future__ import annotations

from kvviz.transcript import token_pieces


def test_pieces_are_faithful_for_emoji_and_specials(lm):
    text = "héllo 😀 world<|im_end|>"
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    pieces = token_pieces(lm.tokenizer, ids)
    assert len(pieces) == len(ids)
    assert pieces[-1] == "<|im_end|>"
    assert "".join(pieces[:3]) == "héllo"
    # the emoji spans two tokens: neither half is a character, both stay visible as byte escapes
    assert pieces[3] == " \\xf0\\x9f\\x98" and pieces[4] == "\\x80"
