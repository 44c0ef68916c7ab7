"""The 2026 cache formats on synthetic tensors: NVFP4 (and its 4-over-6 scale choice), MXFP4 (blocks of 32, and
SGLang's blocks of 16) and the per-token-head int / FP8 caches, against torchao's ``NVFP4Tensor`` / ``MXTensor``
round trips (tests/support/torchao_reference.py) and loops written here.

Tolerances. The round trips are compared bit for bit: every operation is elementwise and correctly rounded in IEEE
float32 (division, multiplication, casts, ``round``), and the maxima are exact, so no summation order enters — except
4-over-6's choice, which compares two sums of 16 squared errors: where those differ by less than their float32
rounding (16 terms: 16·u relative) either candidate is right."""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.schemes.catalogue import Scheme, schemes
from kvviz.quant.fp4 import e2m1_
from kvviz.quant.quantizer import Quantizer, fake_quantize
from tests.support import torchao_reference as ao

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def random_kv(seed: int, scale: float) -> torch.Tensor:
    """``(3, 40, 64)`` float32 with channels of different magnitudes, a zero block and an outlier."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 40, 64, generator=generator) * torch.rand(3, 1, 64, generator=generator) * scale
    x[1, 3, :32] = 0.0
    x[2, 7, 5] = 40 * scale
    return x


def test_e2m1_rounds_to_the_nearest_value_ties_to_an_even_mantissa():
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -5.0, 0.26, 4.99])
    assert e2m1_(midpoints.clone()).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, -4.0, 0.5, 4.0]
    grid = torch.tensor(E2M1 + [-v for v in E2M1])
    assert torch.equal(e2m1_(grid.clone()), grid)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
@pytest.mark.parametrize("name, reference", [("nvfp4", ao.nvfp4), ("mxfp4", ao.mxfp4),
                                             ("mxfp4-b16", lambda x: ao.mxfp4(x, 16))])
def test_the_round_trip_is_torchaos_bit_for_bit(name, reference, scale):
    x = random_kv(3, scale)
    quantizer = schemes([name])[0].edit([40], 40).keys
    out = fake_quantize(x, 4, quantizer)
    assert torch.equal(out, reference(x.reshape(-1, 64)).reshape(x.shape))
    assert not torch.equal(out, x)


def four_over_six(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The test's loop: per block of 16, NVFP4 with the block's largest value mapped to 6 and to 4 (torchao's order
    of operations); returns both candidates and the float64 squared error of each, per block."""
    tensor = x.abs().max() / (448 * 6)
    candidates = []
    for target in (6.0, 4.0):
        out = torch.empty_like(x)
        for row in range(x.shape[0]):
            for start in range(0, x.shape[1], 16):
                block = x[row, start:start + 16]
                scale = (block.abs().max() / target / tensor).clamp(2.0**-6, 448).to(torch.float8_e4m3fn).float()
                out[row, start:start + 16] = e2m1_(block * ((1.0 / tensor) / scale)) * (tensor * scale)
        candidates.append(out)
    errors = [(c.double() - x.double()).square().view(x.shape[0], -1, 16).sum(-1) for c in candidates]
    return *candidates, torch.stack(errors)


def test_four_over_six_keeps_per_block_the_scale_that_errs_less():
    x = random_kv(5, 2.0).reshape(-1, 64)
    out = fake_quantize(x[None], 4, Quantizer("token", format="nvfp4-4over6"))[0]
    six, four, errors = four_over_six(x)
    blocks = lambda t: t.view(x.shape[0], -1, 16)  # noqa: E731
    clear = (errors[0] - errors[1]).abs() > 16 * 2.0**-24 * errors.amax(0)  # not a tie within float32 rounding
    chosen = torch.where((errors[1] < errors[0])[..., None], blocks(four), blocks(six))
    assert torch.equal(blocks(out)[clear], chosen[clear])
    tied = blocks(out)[~clear]
    candidates = zip(tied, blocks(six)[~clear], blocks(four)[~clear])
    assert all(torch.equal(b, s) or torch.equal(b, f) for b, s, f in candidates)
    assert bool((errors[1] < errors[0]).any() and (errors[0] < errors[1]).any())  # both choices happen
    assert (out - x).square().sum() < (six - x).square().sum()


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_int_per_token_head_is_one_symmetric_float32_scale_per_slot_and_head(bits):
    x = random_kv(7, 3.0)
    out = fake_quantize(x, bits, Quantizer("token", symmetric=True, fp32_scales=True))
    top = 2 ** (bits - 1) - 1
    for head in range(x.shape[0]):
        for slot in range(x.shape[1]):
            row = x[head, slot]
            scale = (row.abs().max() / top).clamp(min=torch.finfo(torch.float32).tiny)
            assert torch.equal(out[head, slot], torch.round(row / scale) * scale)


def test_fp8_per_token_head_is_one_float32_scale_per_slot_and_head():
    x = random_kv(8, 3.0)
    out = fake_quantize(x, 8, Scheme("fp8-token-head").edit([40], 40).keys)
    for head in range(x.shape[0]):
        for slot in range(x.shape[1]):
            row = x[head, slot]
            scale = row.abs().max() / 448
            assert torch.equal(out[head, slot], (row / scale).to(torch.float8_e4m3fn).float() * scale)


def test_a_block_that_does_not_divide_the_head_dimension_is_refused():
    x = torch.randn(2, 4, 24)
    with pytest.raises(KvvizError, match="group size 16 does not divide the head dimension 24"):
        fake_quantize(x, 4, Quantizer("token", format="nvfp4"))
    with pytest.raises(KvvizError, match="stores 4 bits per element"):
        fake_quantize(torch.randn(2, 4, 32), 8, Quantizer("token", format="mxfp4"))
    with pytest.raises(KvvizError, match="axis 'token'"):
        Quantizer("channel", format="nvfp4")
