"""Quantizers and edits: property tests (hypothesis) for the round-trip bound, validation and JSON."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvviz.edit.edit import Edit, Eviction
from kvviz.errors import KvvizError
from tests.support.error_bounds import error_bound
from kvviz.quant.quantizer import Quantizer, fake_quantize, packed_bytes

quantizers = st.builds(
    Quantizer, axis=st.sampled_from(["channel", "token"]), group_size=st.sampled_from([None, 1, 2, 4, 8, 16]),
    symmetric=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(kv=st.integers(1, 3), n=st.integers(1, 20), bits=st.sampled_from([8, 4, 3, 2]), quantizer=quantizers,
       seed=st.integers(0, 2**16), scale=st.floats(1e-3, 1e3))
def test_round_trip_error_within_half_a_step(kv, n, bits, quantizer, seed, scale):
    x = torch.randn(kv, n, 16, generator=torch.Generator().manual_seed(seed)) * scale
    x_hat = fake_quantize(x, bits, quantizer)
    assert x_hat.shape == x.shape and x_hat.dtype == x.dtype
    bound = error_bound(x, bits, quantizer)
    assert bool(((x_hat - x).abs() <= bound * (1 + 1e-5) + 1e-6 * scale).all())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), quantizer=quantizers)
def test_more_bits_give_a_tighter_bound(seed, quantizer):
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(seed))
    bounds = [error_bound(x, bits, quantizer) for bits in (8, 4, 3, 2)]
    assert all(bool((tight <= loose).all()) for tight, loose in zip(bounds, bounds[1:]))
    assert fake_quantize(x, 16, quantizer) is x


def test_packed_bytes_follow_the_bits():
    q = Quantizer("token", group_size=32)
    sizes = [packed_bytes(100, bits, 64, q, 4) for bits in (16, 8, 4, 3, 2)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] == 100 * 64 * 4
    assert sizes[2] == 100 * 64 * 4 // 8 + 100 * 2 * 2 * 2  # 4-bit codes + (scale, zero) fp16 per group of 32
    channel = Quantizer("channel", symmetric=True)
    assert packed_bytes(100, 2, 64, channel, 4) == 100 * 64 * 2 // 8 + 64 * 2


@settings(max_examples=100, deadline=None)
@given(slots=st.lists(st.integers(-3, 40), max_size=6), bits=st.sampled_from([16, 8, 4, 3, 2, 5, 1, 0, "4", 4.0]),
       layers=st.one_of(st.none(), st.lists(st.integers(-1, 40), max_size=3)),
       heads=st.one_of(st.none(), st.lists(st.integers(-1, 4), max_size=3)), at=st.integers(0, 30))
def test_edit_validation_never_crashes_and_holds_invariants(slots, bits, layers, heads, at):
    try:
        edit = Edit(evictions=(Eviction(tuple(slots), layers and tuple(layers), heads and tuple(heads)),),
                    key_bits=dict.fromkeys([s for s in slots if s >= 0], bits))
        edit.validate(at, layers=30, kv_heads=3, head_dim=64)
    except KvvizError:
        return
    assert all(0 <= s < at for s in edit.touched_slots())
    assert set(edit.key_bits.values()) <= {8, 4, 3, 2}
    mask = edit.evicted_mask(at + 1, 30, 3)
    assert not bool(mask[:, :, at].any())
    assert Edit.from_dict(edit.to_dict()) == edit


@pytest.mark.parametrize("bad, message", [
    (lambda: Edit.quantize([1], 5), "bit-width"),
    (lambda: Edit.quantize([1], "4"), "bit-width"),
    (lambda: Edit.evict([1], layers=[]), "empty"),
    (lambda: Edit.evict([-1]), "non-negative"),
    (lambda: Quantizer("row"), "granularity"),
    (lambda: Edit.from_dict({"evict": [{"nope": 1}]}), "malformed"),
])
def test_bad_edits_are_refused_with_a_clear_message(bad, message):
    with pytest.raises(KvvizError, match=message):
        bad()


def test_validation_against_a_step():
    with pytest.raises(KvvizError, match="being processed"):
        Edit.evict([5]).validate(5, 30, 3, 64)
    with pytest.raises(KvvizError, match="not in the cache"):
        Edit.evict([9]).validate(5, 30, 3, 64)
    with pytest.raises(KvvizError, match="does not divide"):
        Edit.quantize([1], 4, keys=Quantizer("token", 24)).validate(5, 30, 3, 64)
    with pytest.raises(KvvizError, match="KV head 3"):
        Edit.evict([1], heads=[3]).validate(5, 30, 3, 64)


def test_full_precision_window_and_json_round_trip():
    edit = Edit.quantize(range(10), 4, 2, full_precision_window=3)
    resolved = edit.resolved(10)
    assert sorted(resolved.key_bits) == list(range(7)) and resolved.value_bits[0] == 2
    assert Edit.from_dict(edit.to_dict()) == edit


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), quantizer=quantizers)
def test_cache_memory_counts_every_kv_head_and_segment(seed, quantizer):
    """The vectorised byte count against a plain loop over (layer, KV head, segment) with packed_bytes."""
    from kvviz.whatif.memory import cache_memory

    generator = torch.Generator().manual_seed(seed)
    layers, kv_heads, n, dim = 3, 2, 12, 16
    if quantizer.group_size is not None and dim % quantizer.group_size:
        return
    evicted = torch.rand(layers, kv_heads, n, generator=generator) < 0.3
    widths = [16, 8, 4, 3, 2]
    bits = {s: widths[int(torch.randint(5, (1,), generator=generator))] for s in range(n)}
    edit = Edit(key_bits=bits, value_bits={s: widths[(widths.index(b) + 1) % 5] for s, b in bits.items()},
                keys=quantizer, values=quantizer)
    segments = ["history"] * 5 + ["query"] * 4 + ["generated"] * 3

    def reference(slots: list[int]) -> int:
        total = 0
        for kind in ("key", "value"):
            widths_of = edit.key_bits if kind == "key" else edit.value_bits  # 16-bit slots are not stored
            table = [widths_of.get(slot, 16) for slot in range(n)]
            for layer in range(layers):
                for head in range(kv_heads):
                    kept = [s for s in slots if not evicted[layer, head, s]]
                    for width in set(widths):
                        count = sum(table[s] == width for s in kept)
                        total += packed_bytes(count, width, dim, quantizer, 4)
        return total

    memory = cache_memory(edit, evicted, segments, (dim, dim), torch.float32)
    assert memory.edited_bytes == reference(list(range(n)))
    for name in ("history", "query", "generated"):
        slots = [s for s, seg in enumerate(segments) if seg == name]
        assert memory.segments[name].edited_bytes == reference(slots)
        assert memory.segments[name].full_bytes == len(slots) * 2 * layers * kv_heads * dim * 4


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("axis", ["channel", "token"])
def test_constant_groups_come_back_exactly(axis, symmetric):
    x = torch.full((2, 5, 8), -1.25)
    x[1] = 0.0
    for bits in (8, 4, 2):
        assert torch.equal(fake_quantize(x, bits, Quantizer(axis, symmetric=symmetric)), x)
