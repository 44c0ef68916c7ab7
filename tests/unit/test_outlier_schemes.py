"""Outlier-aware quantization (docs/math.md §4): a Hadamard rotation of the head dimension before rounding (QuaRot)
and outlier channels kept exact (KVQuant's dense-and-sparse split, per channel), against references written here on
synthetic tensors: the round trip and its bound, the bytes, and settings a head cannot take.

Tolerances. The round trips repeat the same float32 operations (matrix products, the min/max quantizer written here)
and are compared exactly. The error bound holds up to the rotation's float32 rounding: two products of D terms,
each within D·u·‖x‖∞ (u = 2⁻²⁴).
"""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import KvvizError
from tests.support.error_bounds import error_bound
from kvviz.quant.quantizer import Quantizer, fake_quantize, hadamard, packed_bytes
from kvviz.schemes.catalogue import Scheme

U = 2.0**-24


def sylvester(dim: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    for _ in range(dim.bit_length() - 1):
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / dim**0.5


def min_max(x: torch.Tensor, bits: int, dim) -> torch.Tensor:
    """The asymmetric min/max round trip, written out: (x − low)/scale rounded, back."""
    low = x.amin(dim, keepdim=True)
    scale = ((x.amax(dim, keepdim=True) - low) / (2**bits - 1)).clamp_min(torch.finfo(torch.float32).tiny)
    return ((x - low) / scale).round() * scale + low


def outlier_keys(seed: int = 0) -> torch.Tensor:
    """(KV, n, D) keys with a few large channels per KV head, as real keys have (KIVI's figure 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 29, 64, generator=g)
    for head, channels in enumerate(([5, 40], [0, 63, 17], [33])):
        x[head, :, channels] *= 20
    return x


def test_the_hadamard_matrix_is_sylvesters_and_orthogonal():
    for dim in (1, 2, 16, 64, 128):
        h = hadamard(dim)
        assert torch.allclose(h, sylvester(dim), rtol=0, atol=U)
        assert torch.allclose(h @ h, torch.eye(dim), rtol=0, atol=4 * dim * U)


@pytest.mark.parametrize("bits, axis", [(2, "token"), (4, "token"), (4, "channel"), (3, "head")])
def test_a_rotated_round_trip_is_rounding_in_the_hadamard_basis(bits, axis):
    x = outlier_keys(bits)
    h = hadamard(64)
    dim = {"token": -1, "channel": 1, "head": (1, 2)}[axis]
    expected = min_max(x @ h, bits, dim) @ h
    got = fake_quantize(x, bits, Quantizer(axis, rotation="hadamard"))
    assert torch.equal(got, expected)
    slack = 2 * 64 * U * float(x.abs().max()) * 4  # two products, before and after the rounding
    bound = error_bound(x, bits, Quantizer(axis, rotation="hadamard"))
    assert bool(((got - x).abs() <= bound + slack).all())
    plain = fake_quantize(x, bits, Quantizer(axis))
    if axis == "token":  # per-token scales are set by the outliers; spread out, the other channels keep more
        assert float((got - x).norm()) < 0.7 * float((plain - x).norm())


@pytest.mark.parametrize("bits, axis, kept", [(2, "token", 3), (4, "token", 1), (2, "channel", 2), (8, "head", 4)])
def test_outlier_channels_stay_exact_and_the_rest_round_without_them(bits, axis, kept):
    x = outlier_keys(kept)
    quantizer = Quantizer(axis, outliers=kept)
    got = fake_quantize(x, bits, quantizer)
    dim = {"token": -1, "channel": 1, "head": (1, 2)}[axis]
    for head in range(x.shape[0]):
        peaks = x[head].abs().amax(0).tolist()
        outliers = sorted(range(64), key=lambda c: (-peaks[c], c))[:kept]
        rest = [c for c in range(64) if c not in outliers]
        assert torch.equal(got[head][:, outliers], x[head][:, outliers])
        assert torch.equal(got[head][:, rest], min_max(x[head:head + 1][:, :, rest], bits, dim)[0])
    bound = error_bound(x, bits, quantizer)
    assert bool(((got - x).abs() <= bound).all()) and int((bound == 0).sum()) == kept * x.shape[0] * x.shape[1]


def test_outlier_bytes_hold_the_kept_channels_at_the_models_width_and_name_them():
    plain = packed_bytes(10, 4, 60, Quantizer("token"), 4)
    assert packed_bytes(10, 4, 64, Quantizer("token", outliers=4), 4) == 10 * 4 * 4 + 4 + plain
    assert packed_bytes(10, 16, 64, Quantizer("token", outliers=4), 4) == 10 * 64 * 4  # untouched: no split


@pytest.mark.parametrize("quantizer, head_dim, message", [
    (dict(rotation="hadamard"), 48, "power-of-two head dimension, not 48"),
    (dict(outliers=64), 64, "leave none of the head's 64"),
    (dict(group_size=32, outliers=4), 64, "does not divide the head dimension 64 less its 4 outlier channels"),
])
def test_settings_a_head_cannot_take_are_refused(quantizer, head_dim, message):
    with pytest.raises(KvvizError, match=message):
        Quantizer("token", **quantizer).check(head_dim)


def test_bad_outlier_settings_and_suffixes_are_refused():
    with pytest.raises(KvvizError, match="not both"):
        Quantizer("token", rotation="hadamard", outliers=2)
    with pytest.raises(KvvizError, match="rotation must be"):
        Quantizer("token", rotation="walsh")
    for name in ("kivi-2+hadamard", "int4-token+outliers0", "int4-token+sorted"):
        with pytest.raises(KvvizError, match="takes \\+hadamard or \\+outliersK"):
            Scheme(name)
    assert Scheme("int2-token+outliers4").edit([10], 9).keys == Quantizer("token", outliers=4)
