"""Figure builders and view data on the bundled model: shapes and values come from the session, nothing invented."""

from __future__ import annotations

import altair as alt
import numpy as np
import pytest
import vl_convert

from kvviz import figures
from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.spelling import spell, spell_slot
from kvviz.session import Session
from kvviz.view_data import attention_row, head_map, overview, strip_chips
from kvviz.whatif import Detail, what_if
from tests.support.rounding import rescored_weight_rounding, worst_ratio


@pytest.fixture(scope="module")
def session(lm):
    session = Session(lm)
    session.add_user_turn("Hello there, how are you?")
    session.generate(5)
    return session


def test_strip_and_attention_views(session):
    at = len(session) - 1
    draft = EditDraft()
    draft.toggle_evicted(3)
    draft.set_bits([4], 4, 2)
    chips = strip_chips(session, draft, at, layer=2, head=None)
    assert [c[0] for c in chips] == list(range(at + 1))
    assert chips[3][5] == 1 and chips[4][6:8] == [4, 2] and max(c[4] for c in chips) == 1.0
    row = attention_row(session, at, 2, 5)
    rel = rescored_weight_rounding(session.queries.layer(2), session.layer_kv(2)[0], session.lm.scaling)
    assert worst_ratio(row, session.attention_row(2, 5, at), rel, absolute=1e-12) <= 1  # one head vs all
    rows = overview(session, at, bins=16)
    assert rows.shape[:2] == (30, 9) and rows.shape[2] <= 16
    assert rows[7, 4].max() == pytest.approx(float(attention_row(session, at, 7, 4).max()))
    weights, block = head_map(session, 2, 5, size=8)
    assert weights.shape[0] <= 8 and block * weights.shape[0] >= len(session)
    assert figures.overview_figure(rows, 3, at).data[0].z.shape[1] == 9 * rows.shape[2] + 2 * 2


def test_the_head_map_names_tokens_stops_at_the_step_looked_at_and_the_overview_frames_the_head(session):
    n = len(session)
    back = n - 4  # a step looked back at
    full, _ = head_map(session, 2, 5)
    weights, block = head_map(session, 2, 5, stop=back + 1)
    assert block == 1 and weights.shape == (back + 1, back + 1)
    assert np.array_equal(weights, full[: back + 1, : back + 1])  # no row (or key) of a later step
    texts = [s.text for s in session.transcript.slots[: back + 1]]
    heatmap = figures.head_map_figure(weights, block, [], "t", texts).data[0]
    assert list(heatmap.y) == [spell_slot(i, t) for i, t in enumerate(texts)] == list(heatmap.x)  # tokens on hover
    assert "query %{y}" in heatmap.hovertemplate and "key %{x}" in heatmap.hovertemplate
    rows = overview(session, back, bins=16)
    frame = figures.overview_figure(rows, 3, back, chosen=(7, 4)).layout.shapes
    assert len(frame) == 1 and (frame[0].y0, frame[0].y1) == (6.5, 7.5)
    z = figures.overview_figure(rows, 3, back).data[0].z  # the framed columns are head 4's tile (KV group 1)
    left = 4 * rows.shape[2] + 2
    assert np.array_equal(z[7, left : left + rows.shape[2]], rows[7, 4]) and frame[0].x0 == left - 0.5


def valid(chart) -> dict:
    """The chart's standalone spec, checked against the Vega-Lite schema (Altair's copy)."""
    spec = chart.to_dict()
    alt.TopLevelSpec.from_dict(spec)  # raises on anything the schema does not allow
    return spec


def test_whatif_charts_and_html(session):
    result = what_if(session, Edit.evict([2, 3]), layer=1, head=1)
    texts = [s.text for s in session.transcript.slots[: result.at + 1]]
    alpha = figures.alpha_chart(result.detail, texts)
    spec, rows, n = valid(alpha), alpha.data, len(result.detail.slots)
    series = {name: part for name, part in rows.groupby("series", sort=False)}
    assert list(series) == ["α full", "α′ = α/(1−ρ)", "α used by the edited run"] and len(rows) == 3 * n
    assert list(series["α full"]["weight"]) == pytest.approx(result.detail.alpha_full)
    assert list(series["α used by the edited run"]["weight"]) == pytest.approx(
        [v or 0 for v in result.detail.alpha_edited])
    assert list(series["α full"]["slot"]) == result.detail.slots
    assert sorted(set(rows.loc[rows["evicted"], "slot"])) == [2, 3]  # the evicted slots, crossed
    assert spec["layer"][0]["mark"] == "bar"  # short: grouped bars, each slot named by its token on the axis
    svg = vl_convert.vegalite_to_svg(spec)
    named = max(range(len(texts)), key=lambda s: (texts[s].strip().isalpha(), len(texts[s].strip()) <= 8, len(texts[s])))
    assert f">{named} {spell(texts[named])}<" in svg, texts[named]  # e.g. "12 ␣Whiskers"
    long = Detail(0, 0, list(range(300)), [1 / 300] * 300, [None] * 10 + [1 / 290] * 290, [None] * 10 + [1 / 290] * 290)
    marks = [layer["mark"]["type"] for layer in valid(figures.alpha_chart(long, ["t"] * 300))["layer"]]
    assert marks == ["line", "point", "point"]  # long: step lines, hover targets, crosses
    n, rng = 3000, np.random.default_rng(0)  # over POINT_LIMIT: each series is its max over blocks of 3 slots
    full = rng.random(n)
    renorm = [None if 1500 <= s < 1504 else float(v) for s, v in enumerate(full)]
    blocked = figures.alpha_chart(Detail(0, 0, list(range(n)), full.tolist(), renorm, renorm), ["t"] * n)
    spec, rows = valid(blocked), blocked.data
    firsts = rows[rows["series"] == "α full"]
    assert list(firsts["slot"]) == list(range(0, n, 3)) and "block of 3 slots" in spec["title"]
    assert list(firsts["weight"]) == pytest.approx([full[a:a + 3].max() for a in range(0, n, 3)])
    assert list(firsts.loc[firsts["evicted"], "slot"]) == [1500, 1503]  # the blocks holding slots 1500..1503
    assert firsts["token"].iloc[1] == "slots 3–5"
    grid = figures.head_grid_chart(result.heads)
    valid(grid)
    assert len(grid.data) == 3 * 30 * 9 and set(grid.data["map"]) == set(figures.whatif_charts.MAPS.values())
    rho = grid.data[grid.data["map"] == "evicted mass ρ"]["value"]
    assert list(rho) == pytest.approx([x for row in result.heads["rho"].tolist() for x in row])
    hidden = figures.hidden_chart(result.hidden_delta)
    assert list(valid(hidden)["data"]["values"][i]["delta"] for i in range(31)) == pytest.approx(result.hidden_delta)
    table = figures.topk_frame(result.next_token, "edited")
    assert list(table["p"]) == [c.prob for c in result.next_token.edited]
    page = figures.figures_html([alpha, figures.head_grid_chart(result.heads), hidden], "t <b>")
    assert "vegaEmbed" in page and "cdn.jsdelivr" not in page  # inlined: opens offline
    assert page.count("t &lt;b&gt;") == 1 and "t &lt;b&gt;" in page.rpartition("<body>")[2]  # in the page's body
    assert figures.growth(session.transcript).data[0].y[-1] == session.transcript.growth[-1].history
