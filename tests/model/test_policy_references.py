"""SnapKV and PyramidKV against references written here from their formulas, on the bundled model: kept sets per layer
and KV head at budgets from tiny to n − 1 on an uneven n, the most recent protected slots kept where a layer's budget
is smaller than the window, and pooling that never sees the observation window's own columns."""

from __future__ import annotations

import pytest
import torch

from kvviz.policies import PyramidKV, SnapKV
from kvviz.policies.pyramid_kv import pyramid
from kvviz.session import Session

PROMPT = ("The lighthouse keeper wrote down the ships that passed: the Aurora at dawn, the Bellwether at noon, "
          "the Cormorant at dusk. Which ship passed at noon?")


@pytest.fixture(scope="module")
def prompt(make_chat, lm) -> Session:
    session = make_chat(PROMPT)
    return session


def votes(session: Session, at: int, window: int) -> torch.Tensor:
    """(L, KV, at): attention of the window's queries to each slot from the session's recomputed weights, summed over
    the queries, then over the query heads of each KV group (float32 sums in that order, so that the reference ranks
    the very numbers the policy ranks and ties stay ties)."""
    lm = session.lm
    rows = torch.zeros(lm.layers, lm.heads, at)
    for layer in range(lm.layers):
        weights = session.weights(layer, at - window, at)  # (H, window, ≤ at)
        rows[layer, :, : weights.shape[-1]] = weights.sum(1)
    return rows.view(lm.layers, lm.kv_heads, lm.heads // lm.kv_heads, at).sum(2)


def reference_kept(score: list[float], budget: int, protected: int) -> set[int]:
    """The most recent ``protected`` slots first (newest first), then the highest scores, earlier slot on ties."""
    at = len(score)
    recent = list(range(at - 1, at - 1 - protected, -1))
    others = sorted(range(at - protected), key=lambda slot: (-score[slot], slot))
    return set((recent + others)[:budget])


def reference_snapkv_scores(votes: torch.Tensor, window: int, kernel: int) -> torch.Tensor:
    """Max pooling over neighbours, only among the columns before the window; the window's columns unpooled."""
    at, half = votes.shape[-1], kernel // 2
    pooled = votes.clone()
    for slot in range(at - window):
        pooled[..., slot] = votes[..., max(0, slot - half): min(at - window, slot + half + 1)].amax(-1)
    return pooled


@pytest.mark.parametrize("policy", [SnapKV(), PyramidKV()], ids=["snapkv", "pyramid_kv"])
def test_kept_sets_equal_the_reference_per_layer_and_kv_head(lm, prompt, policy):
    at = len(prompt) - 1
    window = min(policy.window, at)
    scores = reference_snapkv_scores(votes(prompt, at, window), window, policy.kernel)
    for keep in sorted({1, 2, 3, 5, 8, 13, 21, 40, at // 2, at - 33, at - 2, at - 1}):
        evicted = policy.edit(prompt, keep, at=at).evicted_mask(at + 1, lm.layers, lm.kv_heads)[:, :, :at]
        budgets = pyramid(keep, lm.layers, policy.beta, at).tolist() if isinstance(policy, PyramidKV) \
            else [keep] * lm.layers
        protected = min(window, keep // 2)
        for layer in range(lm.layers):
            for head in range(lm.kv_heads):
                kept = set((~evicted[layer, head]).nonzero()[:, 0].tolist())
                expected = reference_kept(scores[layer, head].tolist(), budgets[layer], protected)
                assert kept == expected, (keep, layer, head)
                assert at - 1 in kept or not protected  # the newest slot (the prompt's last token) is protected


def test_a_small_layer_keeps_the_newest_protected_slots(lm, prompt):
    """The bug this guards: with a layer's budget below the protected window, the oldest protected slots were kept."""
    at = len(prompt) - 1
    keep = at // 2
    last = pyramid(keep, lm.layers, 20.0, at)[-1].item()
    assert last < min(32, keep // 2)  # the last layer's budget is smaller than the protected window here
    evicted = PyramidKV().edit(prompt, keep, at=at).evicted_mask(at + 1, lm.layers, lm.kv_heads)[-1, :, :at]
    for head in range(lm.kv_heads):
        assert (~evicted[head]).nonzero()[:, 0].tolist() == list(range(at - last, at))


def test_snapkv_pooling_never_sees_the_window(lm, prompt):
    """The slot just before the window is scored by the votes before the window only: raising the window's votes
    changes nothing there."""
    from kvviz.policies.base import Candidates

    at = len(prompt) - 1
    alive = torch.ones(lm.layers, lm.kv_heads, at, dtype=torch.bool)
    candidates = Candidates(prompt, at, 1, alive)  # keep 1: nothing protected, every score as computed
    scores = SnapKV().score(candidates)
    reference = reference_snapkv_scores(votes(prompt, at, 32), 32, 7)
    assert torch.equal(scores, reference)
    boosted = reference_snapkv_scores(votes(prompt, at, 32).index_fill(-1, torch.arange(at - 32, at), 1e3), 32, 7)
    assert torch.equal(boosted[..., : at - 32], reference[..., : at - 32])
