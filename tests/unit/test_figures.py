"""Pooling for long rows: a block of slots is drawn as its maximum (synthetic tensors)."""

from __future__ import annotations

import numpy as np

from kvviz import figures
from kvviz.view_data import pool


def test_pool_keeps_the_maximum_of_each_block():
    values = np.arange(10.0)
    assert pool(values, 4, axis=0).tolist() == [2.0, 5.0, 8.0, 9.0]
    assert pool(values, 20, axis=0) is values


def test_a_long_row_is_drawn_as_blocks_of_slots_holding_their_maximum():
    from kvviz.figures.growth import SEGMENT_COLOURS
    from kvviz.figures.whatif_charts import POINT_LIMIT

    n = 3 * POINT_LIMIT + 5  # blocks of 4 slots, the last one short
    row = np.random.default_rng(0).random(n) / n
    row[2050] = 0.5  # a spike inside a block of query slots
    segments = ["history"] * 2049 + ["query"] * (n - 2049)
    bars = figures.row_figure(row.tolist(), [f"t{i}" for i in range(n)], segments, "row").data[0]
    assert list(bars.y) == pool(row, POINT_LIMIT, 0).tolist()  # the reference: max-pooling as the maps do
    assert bars.width == 4 and bars.x[0] == 1.5 and bars.x[-1] - 1.5 + 4 >= n  # the blocks cover every slot
    assert bars.customdata[512] == "slots 2048–2051, the most at slot 2050 t2050"
    assert bars.marker.color[512] == SEGMENT_COLOURS["query"]  # the colour of the slot that holds the maximum
    short = figures.row_figure([0.25, 0.75], ["a", "b"], ["query", "generated"], "row")
    assert list(short.data[0].y) == [0.25, 0.75] and "block" not in short.layout.title.text
