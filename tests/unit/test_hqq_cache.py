"""HQQ cache settings kvviz cannot run are refused in one line (no model)."""

from __future__ import annotations

import pytest

from kvviz.errors import KvvizError
from kvviz.schemes.quanto import QuantoCache
from kvviz.schemes.catalogue import Scheme

pytest.importorskip("hqq", reason="hqq is not installed: QuantizedCache's HQQ backend cannot be compared "
                                  "(pip install hqq==0.2.8)")


def test_hqq_settings_are_refused_in_one_line():
    with pytest.raises(KvvizError, match="nbits 1, 2, 3, 4, 8"):
        QuantoCache(nbits=5, backend="hqq")
    with pytest.raises(KvvizError, match="0 or 1 with HQQ"):
        QuantoCache(axis_key=-1, backend="hqq")
    with pytest.raises(KvvizError, match="'quanto' or 'hqq'"):
        QuantoCache(backend="fp8")
    with pytest.raises(KvvizError, match="does not divide the head dimension 64"):
        QuantoCache(4, 48, backend="hqq").check(64)
    with pytest.raises(KvvizError, match="a policy run's cache"):
        Scheme("hqq-4").edit([10], 9)
