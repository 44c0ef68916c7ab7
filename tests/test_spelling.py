"""One way to write a token (kvviz.spelling): the rule itself against an independent decoder of the marks, and every
place that shows a token — the strip, figures' labels, the next-token tables, the scheme comparison, the command line —
spelling it that way, on the real model with a message whose tokens hold spaces, line breaks, a tab, an emoji split
over byte tokens and an invisible character."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvviz import figures
from kvviz.cli.chat import print_transcript
from kvviz.cli.common import chat_document
from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.quant.catalogue import schemes
from kvviz.spelling import spell, spell_slot
from kvviz.view_data import head_map, strip_chips
from kvviz.whatif import what_if
from kvviz.whatif.compare_schemes import compare_schemes

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


@pytest.fixture(scope="module")
def chat(make_chat):
    """A chat whose cached pieces hold a space-led word, a line break, a tab, emoji bytes and a zero-width space."""
    session = make_chat("Two pets:\n\tRex 🐶 and Tom\u200b. Name them?", generate=6)
    pieces = [s.text for s in session.transcript.slots]
    assert "\n" in pieces and "\t" in pieces and any(p.startswith(" ") for p in pieces)
    assert any("\\x" in p for p in pieces)  # the emoji's bytes, escaped by token_pieces
    return session, pieces


def test_the_strip_and_the_figures_spell_each_token(chat):
    session, pieces = chat
    at = len(session) - 1
    assert [c[1] for c in strip_chips(session, EditDraft(), at, 0, None)] == [spell(p) for p in pieces]
    weights, block = head_map(session, 2, 5, stop=at + 1)
    heatmap = figures.head_map_figure(weights, block, [], "t", pieces).data[0]
    assert list(heatmap.y) == [spell_slot(s, p) for s, p in enumerate(pieces)]
    assert not any(re.search(r"'.*'", label) for label in heatmap.y)  # no Python repr left
    result = what_if(session, Edit.evict([3]), at=at)
    for side in ("full", "edited"):
        rows = getattr(result.next_token, side)
        cells = list(figures.whatif_charts.topk_frame(result.next_token, side)["token"])
        assert cells == [spell(c.text) for c in rows] and all(cells)  # never a blank cell


def test_the_scheme_comparison_and_the_command_line_spell_each_token(chat, capsys):
    session, pieces = chat
    row = compare_schemes(session, schemes(["int4-token"]))[0]
    left, right = row.top1.split(" → ")
    assert spell(left) == left and spell(right) == right and "'" not in row.top1
    print_transcript(chat_document(session))
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.rsplit("  ", 1)[1] for line in lines[: len(pieces)]] == [spell(p) for p in pieces]
