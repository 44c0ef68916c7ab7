"""kvpress' presses by name, without a model: the mapping to kvviz policies and its refusals, the ratio's rounding
(kvpress' ``max(1, int(n·(1 − r)))``), and wrappers over other scorers running kvpress' own code. kvpress itself
cannot be installed beside kvviz (it pins transformers < 5.3): scripts/kvpress_parity.py compares with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvviz.errors import KvvizError
from kvviz.policies import (AdaKV, KeyNorm, ObservedAttention, PyramidKV, RandomPolicy, SnapKV, StreamingLLM,
                            TOVA)
from kvviz.policies.base import Ratio, slots_kept
from kvviz.policies.kvpress.presses import PRESSES, from_kvpress, table
from kvviz.policies.pyramid_kv import kvpress_pyramid

ROOT = Path(__file__).resolve().parents[2]


def test_a_ratio_rounds_as_kvpress_and_stands_for_the_fraction_kept():
    for n in (1, 7, 100, 389):
        for ratio in (0.0, 0.1, 0.3, 0.5, 0.7, 0.75, 0.9, 0.99):
            assert slots_kept(Ratio(ratio), n) == max(1, int(n * (1 - ratio)))  # kvpress' compute_n_kept
    assert float(Ratio(0.25)) == 0.75 and str(Ratio(0.25)) == "ratio 0.25"
    assert slots_kept(0.5, 7) == 4 and slots_kept(Ratio(0.5), 7) == 3  # round() against int()
    for bad in (1.0, -0.1, True, "0.5"):
        with pytest.raises(KvvizError, match="compression ratio must be in"):
            Ratio(bad)


def test_presses_map_to_policies_with_kvpress_conventions():
    snap = from_kvpress("SnapKVPress", compression_ratio=0.5)
    assert snap.policy == SnapKV(window=64, kernel=5, pooling="avg", window_kept="all", votes="mean") \
        and snap.ratio.ratio == 0.5
    assert from_kvpress("SnapKVPress", window_size="32", kernel_size="7").policy == SnapKV(32, 7, "avg", "all", "mean")
    assert from_kvpress("PyramidKVPress").policy == PyramidKV(64, 5, "avg", "all", "mean", 20.0, "kvpress")
    assert from_kvpress("AdaKVPress", press="SnapKVPress", alpha_safeguard=0.1).policy == AdaKV(64, 5, "avg", "all",
                                                                                                 "mean", 0.1)
    assert from_kvpress("StreamingLLMPress", n_sink=2).policy == StreamingLLM(sinks=2)
    assert from_kvpress("TOVAPress").policy == TOVA(keep_last=True)
    assert from_kvpress("RandomPress", seed=3).policy == RandomPolicy(seed=3, per_head=True)
    assert from_kvpress("KnormPress").policy == KeyNorm(ties="topk")
    assert from_kvpress("ObservedAttentionPress").policy == ObservedAttention()
    rerotated = from_kvpress("KeyRerotationPress", press="StreamingLLMPress", compression_ratio=0.25)
    assert rerotated.positions == "rerotated" and rerotated.policy == StreamingLLM() and rerotated.ratio.ratio == 0.25
    assert from_kvpress(type("SnapKVPress", (), {})).policy == snap.policy  # a class is named by its name


@pytest.mark.parametrize("call, words", [
    (lambda: from_kvpress("KVgradPress"), "does not run kvpress' KVgradPress: it replays the context"),
    (lambda: from_kvpress("CriticalKVPress"), "wraps a press: give press=NAME"),
    (lambda: from_kvpress("QFilterPress"), "needs query filters trained for the model .* the nearest: key_norm"),
    (lambda: from_kvpress("NoSuchPress"), "kvpress has no press called 'NoSuchPress'; its presses: AdaKVPress"),
    (lambda: from_kvpress("SnapKVPress", window=3), "argument 'window' has no kvviz counterpart"),
    (lambda: from_kvpress("FinchPress"), "its window is the question"),
    (lambda: from_kvpress("BlockPress", no_such=1), "BlockPress has no argument 'no_such'"),
    (lambda: from_kvpress("KeyRerotationPress"), "wraps a press: give press=NAME"),
    (lambda: from_kvpress("DecodingPress", base_press="KnormPress", target_size=0), "target_size must be at least 1"),
    (lambda: from_kvpress("SnapKVPress", compression_ratio=1.5), r"compression_ratio must be in \[0, 1\)"),
])
def test_presses_kvviz_cannot_run_are_refused_in_one_line(call, words):
    with pytest.raises(KvvizError, match=words):
        call()


def test_wrappers_over_other_scorers_run_kvpress_own_code():
    from kvviz.policies.kvpress.own_code import PressCode

    for name in ("CriticalKVPress", "ChunkKVPress", "AdaKVPress", "BlockPress"):
        press = from_kvpress(name, press="TOVAPress", compression_ratio=0.5)
        assert isinstance(press.policy, PressCode) and type(press.policy.instance).__name__ == name
        assert type(press.policy.instance.press).__name__ == "TOVAPress" and press.policy.settings()["press"] == "TOVAPress"


def test_every_press_of_kvpress_has_a_status_in_the_docs():
    from kvviz.policies.kvpress.own_code import own_presses

    text = (ROOT / "docs" / "kvpress.md").read_text()
    names = [*own_presses()]
    assert len(names) == 46 and all(f"| `{name}` |" in text for name in names)


def test_the_docs_hold_the_mapping_table():
    assert table() in (ROOT / "docs" / "kvpress.md").read_text()
    assert all(f"`{name}`" in table() for name in PRESSES)


def test_kvpress_pyramid_schedule_follows_kvcache_factory():
    """get_layer_budget's numbers, worked by hand: n = 324, ratio 0.5, window 64 → 162 kept on average: the first
    layer capped at n − window = 260, the last at the window, linear between; a short prompt falls back to SnapKV."""
    budgets = kvpress_pyramid(324, 324 * 0.5, 64, 20, 30)
    assert budgets[0] == 260 and budgets[-1] == 64 and sum(budgets) == 30 * 162
    assert budgets[1] == round(260 - (260 - 64) / 29)
    assert kvpress_pyramid(324, 324 * 0.25, 64, 20, 30) == [81] * 30  # k/β below the window: plain SnapKV
