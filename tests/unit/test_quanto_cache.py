"""quanto's rounding without a model: its axis-0 group rounding is kvviz's per-token quantizer bit for bit (the same
float32 operations), and QuantizedCache settings kvviz cannot run are refused in one line."""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.quant.quantizer import fake_quantize
from kvviz.runs.compressed import RunSettings
from kvviz.schemes.quanto import QuantoCache

quanto = pytest.importorskip("optimum.quanto", reason="optimum-quanto is not installed: QuantizedCache's quanto "
                                                       "backend cannot be compared (pip install optimum-quanto)")


@pytest.mark.parametrize("bits, group", [(4, 64), (2, 32)])
def test_quantos_axis_0_rounding_is_kvvizs_per_token_quantizer(bits, group):
    x = torch.randn(1, 3, 37, 64, generator=torch.Generator().manual_seed(bits)) * 3
    qtype = quanto.qint4 if bits == 4 else quanto.qint2
    scale, shift = quanto.MaxOptimizer()(x, qtype, 0, group)
    theirs = quanto.quantize_weight(x, qtype, 0, scale, shift, group).dequantize()
    assert torch.equal(theirs[0], fake_quantize(x[0], bits, QuantoCache(bits, group).quantizer))


def test_quantized_cache_settings_are_refused_in_one_line():
    with pytest.raises(KvvizError, match="nbits 2, 4"):
        QuantoCache(nbits=3)
    with pytest.raises(KvvizError, match="0 or -1 with quanto"):
        QuantoCache(axis_key=1)
    from kvviz.schemes.cache_format import one_format
    from kvviz.schemes.kivi import Kivi

    with pytest.raises(KvvizError, match="one cache: KIVI K2/V2 and QuantizedCache \\(quanto\\) 4 bits cannot be"):
        one_format(Kivi(2, 2, 32, 128), QuantoCache())
    with pytest.raises(KvvizError, match="a run's cache format is KIVI, a written scheme or QuantizedCache"):
        RunSettings(cache_format={"quanto": QuantoCache()})
