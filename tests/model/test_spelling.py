"""Every place that shows a token on the bundled model — the strip, figures' labels, the next-token tables, the scheme
comparison, the command line — spells it as kvviz.spelling does, for a message whose tokens hold spaces, line
breaks, a tab, an emoji split over byte tokens and an invisible character."""

from __future__ import annotations

import re

import pytest

from kvviz import figures
from kvviz.cli.chat import print_transcript
from kvviz.cli.common import chat_document
from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.schemes.catalogue import schemes
from kvviz.spelling import spell, spell_slot
from kvviz.view_data import head_map, strip_chips
from kvviz.whatif import what_if
from kvviz.schemes.compare import compare_schemes


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
