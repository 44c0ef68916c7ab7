"""kvpress' CURPress and CriticalKV wrapper map to kvviz's ``cur`` and ``critical_kv`` by name (no model)."""

from __future__ import annotations

import pytest

from kvviz.errors import KvvizError
from kvviz.policies import CUR, CriticalKV
from kvviz.policies.kvpress.presses import from_kvpress


def test_kvpress_names_map_to_cur_and_critical_kv():
    assert from_kvpress("CURPress", num_sinks="2", leverage_type="key", local_window_size=8).policy == CUR(
        sinks=2, leverage="key", window=8, ties="topk")
    press = from_kvpress("CriticalKVPress", press="KnormPress", first_stage_ratio="0.25", compression_ratio=0.5)
    assert press.policy == CriticalKV(inner="kvpress:KnormPress", first_stage=0.25) and press.ratio.ratio == 0.5
    with pytest.raises(KvvizError, match="argument 'use_random_leverage' has no kvviz counterpart"):
        from_kvpress("CURPress", use_random_leverage=True)
    with pytest.raises(KvvizError, match="leverage must be one of"):
        CUR(leverage="sum")
    with pytest.raises(KvvizError, match="first_stage must be"):
        CriticalKV(first_stage=1.5)
