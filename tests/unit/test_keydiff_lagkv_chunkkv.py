"""kvpress' ChunkKVPress maps over score-only presses to kvviz's ``chunk_kv`` (no model)."""

from __future__ import annotations

import pytest

from kvviz.policies import ChunkKV


def test_kvpress_chunk_kv_maps_over_score_only_presses():
    from kvviz.errors import KvvizError
    from kvviz.policies.kvpress.presses import from_kvpress

    press = from_kvpress("ChunkKVPress", press="KeyDiffPress", chunk_length="10", compression_ratio=0.5)
    assert press.policy == ChunkKV(inner="kvpress:KeyDiffPress", chunk=10) and press.ratio.ratio == 0.5
    assert type(from_kvpress("ChunkKVPress", press="TOVAPress").policy).__name__ == "ChunkKVPress"  # kvpress' code
    with pytest.raises(KvvizError, match="must be a positive integer"):
        ChunkKV(chunk=0)
    with pytest.raises(KvvizError, match="inner must be one of"):
        ChunkKV(inner="no_such_policy")
