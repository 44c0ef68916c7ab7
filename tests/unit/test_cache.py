"""The cache adapter's RoomyLayer on synthetic tensors: appends land in spare room, and its keys/values always equal
what transformers' DynamicLayer (concatenation) holds after the same updates."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from benchmarks.launch_rows import OpCounter
from kvviz import kv_cache
from kvviz.kv_cache import RoomyLayer


def _chunk(generator: torch.Generator, q: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(1, 2, q, 4, generator=generator), torch.randn(1, 2, q, 4, generator=generator)


def test_roomy_layer_equals_concatenation_and_writes_in_place():
    generator = torch.Generator().manual_seed(0)
    roomy, plain = RoomyLayer(), DynamicLayer()
    earlier = []
    for q in (5, 1, 1, 90, 1, 1, 40):  # the prefill makes room for 69 slots: the 90-slot append grows it
        chunk = _chunk(generator, q)
        buffer = roomy._buffers[0] if roomy._buffers else None
        keys, values = roomy.update(*chunk)
        expected = plain.update(*chunk)
        assert torch.equal(keys, expected[0]) and torch.equal(values, expected[1])
        if buffer is not None and keys.shape[2] <= buffer.shape[2]:
            assert keys.data_ptr() == buffer.data_ptr()  # written into the room, nothing copied
        earlier.append((keys, keys.clone()))
    assert all(torch.equal(view, copy) for view, copy in earlier)  # views taken before later appends are unchanged


def test_roomy_layer_after_truncation_and_replaced_tensors():
    generator = torch.Generator().manual_seed(1)
    cache = kv_cache.over([tuple(torch.zeros(1, 2, 12, 4) for _ in range(2))], length=0)
    first = _chunk(generator, 8)
    cache.layers[0].update(*first)
    kv_cache.truncate(cache, 5)  # a failed pass cut back: the next append overwrites slots 5..
    second = _chunk(generator, 3)
    keys, values = cache.layers[0].update(*second)
    assert torch.equal(keys, torch.cat([first[0][:, :, :5], second[0]], 2))
    layer = cache.layers[0]
    layer.keys, layer.values = (t.clone() for t in (layer.keys, layer.values))  # no longer views of the buffers
    third = _chunk(generator, 2)
    keys, _ = layer.update(*third)
    assert torch.equal(keys, torch.cat([first[0][:, :, :5], second[0], third[0]], 2))


def test_a_cache_made_again_over_the_same_buffers_and_views():
    """The what-if's edited runs: a cache over buffers with room for one slot, made again for every run from views
    made once; each run sees the same cached slots and writes only its own."""
    generator = torch.Generator().manual_seed(2)
    prefix = _chunk(generator, 6)
    buffers = [tuple(torch.cat([t, torch.zeros(1, 2, 1, 4)], 2) for t in prefix)]
    views = kv_cache.leading(buffers, 6)
    for _ in range(2):
        new = _chunk(generator, 1)
        layer = kv_cache.over(buffers, 6, views).layers[0]
        with OpCounter() as written:
            keys, values = layer.update(*new)
        assert written.ops == {"aten.copy_": 2}  # into the views of slot 6 made before: no view made per step
        assert keys is buffers[0][0] and torch.equal(values, torch.cat([prefix[1], new[1]], 2))  # full: the buffer
        assert torch.equal(views[0][0][0], prefix[0]) and views[0][0][0].shape[2] == 6  # the made views unchanged


def test_views_made_before_are_written_only_where_the_next_slot_is():
    """The views of the next slot made with the cache are used once, and only when the update really writes that
    slot: after a cut back (or a chunk of two slots) the update writes where the cache ends, as concatenation would."""
    generator = torch.Generator().manual_seed(3)
    prefix = _chunk(generator, 6)
    for cut, q in ((4, 1), (6, 2)):
        buffers = [tuple(torch.cat([t, torch.zeros(1, 2, 2, 4)], 2) for t in prefix)]
        cache = kv_cache.over(buffers, 6, kv_cache.leading(buffers, 6))
        kv_cache.truncate(cache, cut)
        new = _chunk(generator, q)
        keys, values = cache.layers[0].update(*new)
        assert torch.equal(keys, torch.cat([prefix[0][:, :, :cut], new[0]], 2))
        assert torch.equal(values, torch.cat([prefix[1][:, :, :cut], new[1]], 2))
        second = _chunk(generator, 1)  # the made views are spent: the next step writes after the new slots
        keys, _ = cache.layers[0].update(*second)
        assert torch.equal(keys, torch.cat([prefix[0][:, :, :cut], new[0], second[0]], 2))
