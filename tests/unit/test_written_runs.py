"""Per-slot run caches without a model: a later value past the first pass's range saturates, schemes whose scales
span slots are refused in one line, and a written cache runs alone."""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import KvvizError
from kvviz.schemes.catalogue import Scheme
from kvviz.schemes.written import run_cache
from kvviz.schemes.written import WrittenCache
from kvviz.runs.compressed import RunSettings


def test_a_later_value_past_the_first_passs_range_saturates():
    """The fixed scales are static ones: NVFP4's tensor scale from the first pass; a block later 10× as large reads
    back at most 6 · 448 · g."""
    written = WrittenCache("nvfp4")
    first = torch.randn(2, 3, 5, 64)  # (L, KV, n, D)
    template = Scheme("nvfp4").edit([1], 1)
    fixed = WrittenCache("nvfp4", template=template).fixed(first, first)
    assert written.grouping == "blocks" and fixed.first_pass is False
    g = float(first[0].abs().amax()) / (448 * 6)
    assert fixed.template.keys.scales[0] == pytest.approx((g, g, g), rel=1e-6)
    later = torch.randn(3, 4, 64) * 10 * float(first.abs().amax())
    out = fixed.edit(range(4)).quantized(later, later, 0)[0]
    assert float(out.abs().max()) <= 6 * 448 * fixed.template.keys.scales[0][0] * (1 + 1e-6)
    assert float(later.abs().max()) > 6 * 448 * fixed.template.keys.scales[0][0]


@pytest.mark.parametrize("name, message", [
    ("int2-channel", "not a cache a run writes slot by slot"),
    ("mix3-keyerror", "not a cache a run writes slot by slot"),
    ("int4-token+outliers4", "not a cache a run writes slot by slot"),
])
def test_schemes_whose_scales_span_slots_are_refused_in_one_line(name, message):
    with pytest.raises(KvvizError, match=message) as refusal:
        run_cache(name)
    assert "\n" not in str(refusal.value)


def test_a_written_cache_runs_alone():
    from kvviz.edit.reshape import Reshape
    from kvviz.policies import H2O, StreamingLLM
    from kvviz.schemes.cache_format import one_format
    from kvviz.schemes.kivi import Kivi

    with pytest.raises(KvvizError, match="one cache: KIVI K2/V2 and nvfp4 cannot be combined"):
        one_format(Kivi(), WrittenCache("nvfp4"))
    with pytest.raises(KvvizError, match="pruning or merging runs without nvfp4 and with original positions"):
        RunSettings(H2O(), 16, "prefill", cache_format=WrittenCache("nvfp4"), reshape=Reshape(0.25))
    with pytest.raises(KvvizError, match="re-rotated positions need .* the model's own cache"):
        RunSettings(StreamingLLM(), 16, cache_format=WrittenCache("nvfp4"), positions="rerotated")
    assert one_format(None, WrittenCache("nvfp4"), None) == WrittenCache("nvfp4") and one_format(None) is None
