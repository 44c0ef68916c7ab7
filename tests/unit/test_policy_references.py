"""PyramidKV's per-layer budgets against their formula: at every budget from 1 to n − 1 for n = 37, 101, 324 their
mean is exactly the budget, they fall from the first layer to the last and stay within [1, n]."""

from __future__ import annotations

import pytest

from kvviz.policies.pyramid_kv import pyramid


def reference_budgets(keep: int, layers: int, beta: float, n: int) -> list[int]:
    """The line from 2k − k/β to k/β, rounded and held within [1, n]; then one slot at a time to (or from) the
    layers with room, lowest layer first, until the budgets add up to k·L."""
    top, bottom = 2 * keep - keep / beta, keep / beta
    line = [top - (top - bottom) * layer / (layers - 1) for layer in range(layers)]  # ties at .5 go to the even
    budgets = [min(max(round(b), 1), n) for b in line]
    while sum(budgets) != keep * layers:
        sign = 1 if sum(budgets) < keep * layers else -1
        for layer in range(layers):
            if sum(budgets) != keep * layers and 1 <= budgets[layer] + sign <= n:
                budgets[layer] += sign
    return budgets


@pytest.mark.parametrize("n", [37, 101, 324])
def test_pyramid_budgets_average_the_budget_at_every_budget(n):
    for keep in range(1, n):
        budgets = pyramid(keep, 30, 20.0, n)
        assert budgets.tolist() == reference_budgets(keep, 30, 20.0, n), keep
        assert int(budgets.sum()) == 30 * keep and bool((budgets[:-1] >= budgets[1:]).all()), keep
