"""The rounding bounds of tests/support/rounding.py hold where they are derived: synthetic logits in float64, moved by
perturbations of at most ε per entry (random signs and the worst corner), against the bounds for probabilities and
KL."""

from __future__ import annotations

import torch

from kvviz.whatif.metrics import kl_divergence
from tests.support.rounding import kl_rounding, probability_rounding, zero_kl_rounding


def test_probability_and_kl_bounds_hold_for_perturbed_logits():
    generator = torch.Generator().manual_seed(0)
    worst = {"p": 0.0, "kl": 0.0, "zero": 0.0}
    for trial in range(200):
        vocab, spread = 1000, [0.5, 3.0, 10.0][trial % 3]
        full = torch.randn(vocab, generator=generator, dtype=torch.float64) * spread
        other = full + torch.randn(vocab, generator=generator, dtype=torch.float64) * [0.01, 0.3, 2.0][trial % 3 - 1]
        eps = 1e-3
        for sign in (torch.sign(torch.randn(2, vocab, generator=generator, dtype=torch.float64)),  # random corner
                     torch.stack([torch.sign(full - full.mean()), -torch.sign(other - other.mean())])):  # a bad one
            moved_full, moved_other = full + eps * sign[0], other + eps * sign[1]
            p, moved_p = torch.softmax(full, -1), torch.softmax(moved_full, -1)
            worst["p"] = max(worst["p"], float(((moved_p - p).abs() / (probability_rounding(eps) * p)).max()))
            kl, moved_kl = float(kl_divergence(full, other)), float(kl_divergence(moved_full, moved_other))
            worst["kl"] = max(worst["kl"], abs(moved_kl - kl) / kl_rounding(eps, kl))
            worst["zero"] = max(worst["zero"], float(kl_divergence(full, moved_full)) / zero_kl_rounding(eps))
    assert max(worst.values()) <= 1, worst
    assert min(worst.values()) > 0.01, worst  # the bounds are not vacuous: the perturbations come near them
