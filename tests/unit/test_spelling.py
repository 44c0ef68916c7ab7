"""One way to write a token (kvviz.spelling): the rule itself against an independent decoder of the marks; every
character visible and the text kept."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvviz.spelling import spell, spell_slot

MARKS = "␣↵⇥∅"
INVISIBLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}


def unspell(spelled: str) -> str:
    """The marks read back (a reference written from the rule, not from the code): ␣ → space, ↵ → line break,
    ⇥ → tab, a run of <0xNN> → those bytes as UTF-8, ∅ alone → nothing."""
    if spelled == "∅":
        return ""
    out = spelled.replace("␣", " ").replace("↵", "\n").replace("⇥", "\t")
    return re.sub(r"(?:<0x[0-9A-F]{2}>)+",
                  lambda m: bytes(int(h, 16) for h in re.findall(r"<0x([0-9A-F]{2})>", m.group())).decode("utf-8"), out)


@pytest.mark.parametrize("piece, spelled", [
    (" Rex", "␣Rex"), ("Rex ", "Rex␣"), ("  a b ", "␣␣a b␣"), (" ", "␣"), ("\n\n", "↵↵"), ("\t", "⇥"),
    ("", "∅"), ("\\xf0\\x9f\\x98", "<0xF0><0x9F><0x98>"), (" \\x80", "␣<0x80>"), ("\u200b", "<0xE2><0x80><0x8B>"),
    ("a\u00a0b", "a<0xC2><0xA0>b"), ("\r\n", "<0x0D>↵"), ("héllo", "héllo"), ("<|im_end|>", "<|im_end|>"),
])
def test_the_rule(piece, spelled):
    assert spell(piece) == spelled
    assert spell(spelled) == spelled  # spelling twice changes nothing (a figure may get text already spelled)
    assert spell_slot(12, piece) == f"12 {spelled}"


@given(st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters=MARKS + "\\<")))  # no token
# holds a lone surrogate (the session refuses one)
def test_every_character_is_visible_and_the_text_is_kept(text):
    spelled = spell(text)
    assert spelled and spelled == spelled.strip()  # never blank, no space at either end
    assert not any(c != " " and unicodedata.category(c) in INVISIBLE for c in spelled)
    assert unspell(spelled) == text
