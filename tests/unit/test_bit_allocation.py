"""Edits merged part by part keep what each part means (evictions, widths, per-head widths), before any model runs."""

from __future__ import annotations

import pytest

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError


def test_merging_edits_keeps_what_each_part_means():
    """Synthetic edits (no model): a merge rule stays with the merges it belongs to, widths per KV head travel through
    the app's draft, and widths per KV head beside pruned or merged slots are refused in one line."""
    from kvviz.edit.draft import EditDraft
    from kvviz.edit.edit import Merge, Pruning

    added = Edit(merges=(Merge(0, 0, 3, 5, 0.5),), merge_rule="add")
    assert added.merged(Edit.evict([1])).merge_rule == "add"  # an eviction on top keeps CaM's rule
    mixed = Edit.quantize(range(8), 2, head_widths=((3, 4), (2, 8)))
    assert EditDraft.from_edit(mixed).edit(8) == mixed
    for reshaping in (Edit(prunings=(Pruning(0, 0, (1,), (2,)),)), added):
        with pytest.raises(KvvizError, match="cannot be combined") as caught:
            reshaping.merged(mixed)
        assert "\n" not in str(caught.value)
