"""The eviction mask of many scopes, built per (layer, KV head) from evictions grouped by scope, equals one outer
product per eviction (synthetic edits; a session file's 4,000 evictions took 19.5 s one by one)."""

from __future__ import annotations

import pytest

from kvviz.edit.edit import Edit


@pytest.mark.parametrize("seed", range(4))
def test_the_eviction_mask_of_many_scopes_equals_one_outer_product_per_eviction(seed):
    """The mask is built per (layer, KV head) from the evictions grouped by scope (a file's 4,000 evictions took 19.5 s
    as one outer product each, 0.01 s grouped); reference: the outer product of each eviction's layers, heads and
    slots, OR-ed, with slots past the mask's length left out."""
    import random

    import torch

    from kvviz.edit.parts import Eviction

    chance = random.Random(seed)
    scope = lambda size: None if chance.random() < 0.4 else tuple(sorted(chance.sample(range(size), chance.randint(1, size))))  # noqa: E731
    evictions = tuple(Eviction(tuple(sorted(chance.sample(range(60), chance.randint(1, 6)))), scope(4), scope(3))
                      for _ in range(chance.randint(1, 40)))
    n = 50  # some slots lie beyond it
    reference = torch.zeros(4, 3, n, dtype=torch.bool)
    for eviction in evictions:
        for layer in eviction.layers or range(4):
            for head in eviction.heads or range(3):
                for slot in eviction.slots:
                    if slot < n:
                        reference[layer, head, slot] = True
    assert torch.equal(Edit(evictions=evictions).evicted_mask(n, 4, 3), reference)
