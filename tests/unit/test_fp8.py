"""FP8 round trips (e4m3, e5m2) on synthetic tensors: torch's own float8 cast after the group's scale, compared exactly
(the test runs the same float32 division, cast and multiplication), and the bytes: one per element and a float32
scale per group."""

from __future__ import annotations

import pytest
import torch

from tests.support.error_bounds import error_bound
from kvviz.quant.quantizer import Quantizer, fake_quantize, packed_bytes
from tests.support.references import fp8_round_trip


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("axis", ["head", "token", "channel", "tensor"])
def test_the_round_trip_is_torchs_own_fp8_cast(fmt, axis):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 40, 64, generator=generator) * torch.rand(3, 1, 64, generator=generator) * 30
    x[0, 5, 7] = 4000.0  # an outlier sets its group's scale
    quantizer = Quantizer(axis=axis, format=fmt)
    out = fake_quantize(x, 8, quantizer)
    assert torch.equal(out, fp8_round_trip(x, fmt, axis))
    assert bool(((out - x).abs() <= error_bound(x, 8, quantizer)).all())
    assert not torch.equal(out, x) and float((out - x).abs().max()) > 0
    zeros = torch.zeros(3, 4, 64)
    assert torch.equal(fake_quantize(zeros, 8, quantizer), zeros)  # a group of zeros comes back as zeros


def test_fp8_bytes_are_one_per_element_and_a_float32_scale_per_group():
    head, token = Quantizer(axis="head", format="e4m3"), Quantizer(axis="token", format="e5m2")
    assert packed_bytes(100, 8, 64, head, 2) == 100 * 64 + 4
    assert packed_bytes(100, 8, 64, token, 2) == 100 * 64 + 100 * 4
    assert packed_bytes(100, 8, 64, Quantizer(axis="channel", format="e4m3"), 2) == 100 * 64 + 64 * 4
    assert packed_bytes(100, 8, 64, Quantizer(axis="tensor", format="e4m3"), 2) == 100 * 64  # its scale: per layer
