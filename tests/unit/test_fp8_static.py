"""Static FP8 scales on synthetic tensors: values past the range saturate as the engines saturate them, and the
round trip is a clamp and torch's own float8 cast (compared exactly: the same float32 operations)."""

from __future__ import annotations

import pytest
import torch

from tests.support.error_bounds import error_bound
from kvviz.quant.quantizer import Quantizer, fake_quantize, saturated

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def reference(x: torch.Tensor, fmt: str, scale: torch.Tensor) -> torch.Tensor:
    """``x`` through an FP8 cache with fixed scales ``scale`` (broadcast over ``x``): saturate, torch's cast, back."""
    top = torch.finfo(DTYPES[fmt]).max
    return (x / scale).clamp(-top, top).to(DTYPES[fmt]).float() * scale


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_static_scales_saturate_as_the_engines_do_and_round_as_torch_casts(fmt):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2 * 3, 40, 64, generator=generator) * 4  # two layers of three KV heads
    top = torch.finfo(DTYPES[fmt]).max
    calibrated = ((8.0, 2.0, 30.0), (5.0, 12.0, 1.0))  # the largest |x| each KV head's calibration saw
    scales = tuple(tuple(peak / top for peak in row) for row in calibrated)
    quantizer = Quantizer("head", format=fmt, scales=scales)
    table = torch.tensor(scales).reshape(6, 1, 1)
    expected = reference(x, fmt, table)
    assert torch.equal(fake_quantize(x, 8, quantizer), expected)  # every layer's rows at once
    for layer in range(2):  # one layer at a time
        rows = x[3 * layer:3 * layer + 3]
        assert torch.equal(fake_quantize(rows, 8, quantizer, layer), expected[3 * layer:3 * layer + 3])
        bound = error_bound(rows, 8, quantizer, layer)
        assert bool(((fake_quantize(rows, 8, quantizer, layer) - rows).abs() <= bound).all())
    past = x.abs() > table * top
    assert int(past.sum()) > 0 and saturated(x, quantizer) == int(past.sum())
    assert torch.equal(expected[past].abs(), (table * top).expand_as(x)[past])  # clipped to the largest code
    assert saturated(x, Quantizer("head", format=fmt)) == 0  # a dynamic scale reaches its group's largest value
