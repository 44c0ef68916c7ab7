"""Figure builders and view data: shapes and values come from the session, nothing invented."""

from __future__ import annotations

import numpy as np
import pytest

from kvviz import figures
from kvviz.draft import EditDraft
from kvviz.edits import Edit
from kvviz.session import Session
from kvviz.views import attention_row, head_map, overview, pool, strip_chips
from kvviz.whatif import what_if


@pytest.fixture(scope="module")
def session(lm):
    session = Session(lm)
    session.add_user_turn("Hello there, how are you?")
    session.generate(5)
    return session


def test_pool_keeps_the_maximum_of_each_block():
    values = np.arange(10.0)
    assert pool(values, 4, axis=0).tolist() == [2.0, 5.0, 8.0, 9.0]
    assert pool(values, 20, axis=0) is values


def test_strip_and_attention_views(session):
    at = len(session) - 1
    draft = EditDraft()
    draft.toggle_evicted(3)
    draft.set_bits([4], 4, 2)
    chips = strip_chips(session, draft, at, layer=2, head=None)
    assert [c[0] for c in chips] == list(range(at + 1))
    assert chips[3][5] == 1 and chips[4][6:8] == [4, 2] and max(c[4] for c in chips) == 1.0
    row = attention_row(session, at, 2, 5)
    assert row.tolist() == pytest.approx(session.attention_row(2, 5, at).tolist(), abs=1e-6)  # one head vs all: fp32
    rows = overview(session, at, bins=16)
    assert rows.shape[:2] == (30, 9) and rows.shape[2] <= 16
    assert rows[7, 4].max() == pytest.approx(float(attention_row(session, at, 7, 4).max()))
    weights, block = head_map(session, 2, 5, size=8)
    assert weights.shape[0] <= 8 and block * weights.shape[0] >= len(session)
    assert figures.overview_figure(rows, 3, at).data[0].z.shape[1] == 9 * rows.shape[2] + 2 * 2


def test_whatif_figures_and_html(session):
    result = what_if(session, Edit.evict([2, 3]), layer=1, head=1)
    texts = [s.text for s in session.transcript.slots[: result.at + 1]]
    alpha = figures.alpha_figure(result.detail, texts, result.heads["rho"][1][1])
    assert list(alpha.data[0].y) == pytest.approx(result.detail.alpha_full)
    assert list(alpha.data[2].x) == result.detail.slots and alpha.data[2].type == "bar"  # short: bars
    assert list(alpha.data[2].y) == pytest.approx([v or 0 for v in result.detail.alpha_edited])
    assert list(alpha.data[3].x) == [2, 3]  # the evicted slots marked
    grid = figures.head_grid_figure(result.heads)
    assert np.array(grid.data[0].z).shape == (30, 9)
    table = figures.topk_frame(result.next_token, "edited")
    assert list(table["p"]) == [c.prob for c in result.next_token.edited]
    page = figures.figures_html([alpha, grid], "t <b>")
    assert page.count("plotly") > 2 and "t &lt;b&gt;" in page
    assert figures.growth(session.transcript).data[0].y[-1] == session.transcript.growth[-1].history
