"""The one adapter to transformers' cache internals: per-layer ``keys``/``values`` of shape ``(B, KV, n, D)``, keys
stored post-RoPE. Everything else in kvviz goes through these functions. A hybrid model's cache also holds recurrent
layers (no K/V, :mod:`kvviz.recurrent`): the functions here count and touch its KV layers only (:func:`entries`). A
model with sparse selection (DSA, :mod:`kvviz.sparse`) keeps one indexer key per slot beside its K/V
(``indexer_keys`` ``(B, n, Di)``, transformers' ``DynamicIndexedLayer``); the functions here keep them slot for slot
with the K/V."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import Cache, DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicIndexedLayer, DynamicLayer, LinearAttentionCacheLayerMixin

KV = tuple[torch.Tensor, torch.Tensor]
Writer = Callable[[torch.Tensor, torch.Tensor], KV]  # new keys, values (B, KV, q, D) → as the cache stores them


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` with room to grow: ``keys``/``values`` ``(B, KV, n, D)`` are views of the first ``n`` slots
    of larger buffers, and :meth:`update` writes the new slots into that room instead of concatenating everything
    into new tensors (on CPU, a decode step's ``torch.cat`` of every layer into fresh memory costs about a quarter of
    the step at 1k slots). Out of room — or when ``keys``/``values`` were replaced by other tensors — the buffers are
    reallocated with a quarter more room. ``written``: when set, what the layer stores (and the pass attends to) in
    place of the new keys and values — a cache that rounds each slot as it is written (kvviz.schemes.written)."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, length: int = 0,
                 cached: tuple[KV, KV] | None = None, written: Writer | None = None):
        """Over given buffers ``(B, KV, capacity, D)`` whose first ``length`` slots are the cached ones (not copied:
        updates write into them); ``cached``: when made before (:func:`leading`), those slots' views and the views of
        slot ``length``, which the next update of one slot writes; empty without buffers."""
        super().__init__()
        self._buffers, self._next, self.written = None, None, written
        if keys is not None:  # initialized as lazy_initialization would, without its two placeholder tensors
            self.device, self.is_initialized = keys.device, True
            self._buffers = keys, values
            if cached is None:
                self.keys, self.values = keys[:, :, :length], values[:, :, :length]
            else:
                (self.keys, self.values), after = cached
                self._next = None if after is None else (length, after)

    def _fits(self, length: int) -> bool:
        """Whether ``keys``/``values`` are still the leading slots of the buffers, with room for ``length`` slots."""
        if self._buffers is None or self.keys.dim() != 4:
            return False
        return all(view.data_ptr() == buffer.data_ptr() and view.stride() == buffer.stride()
                   and length <= buffer.shape[2] for view, buffer in zip((self.keys, self.values), self._buffers))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> KV:
        """Append ``key_states``/``value_states`` ``(B, KV, q, D)``; returns the whole keys and values."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.written is not None:
            key_states, value_states = self.written(key_states, value_states)
        start = self.get_seq_length()
        stop = start + key_states.shape[2]
        if not self._fits(stop):
            self._buffers = tuple(_grown(old, start, new, stop + max(stop // 4, 64))
                                  for old, new in ((self.keys, key_states), (self.values, value_states)))
        made, self._next = self._next, None
        slots = made[1] if made is not None and made[0] == start == stop - 1 and self._fits(stop) else tuple(
            buffer.narrow(2, start, stop - start) for buffer in self._buffers)  # the views written, made before or now
        for slot, new in zip(slots, (key_states, value_states)):
            slot.copy_(new)
        self.keys, self.values = (buffer if stop == buffer.shape[2] else buffer.narrow(2, 0, stop)
                                  for buffer in self._buffers)  # a full buffer is its own view
        return self.keys, self.values


class RoomyIndexedLayer(RoomyLayer, DynamicIndexedLayer):
    """A :class:`RoomyLayer` that also keeps a DSA indexer's keys ``(B, n, Di)``, appended as transformers'
    ``DynamicIndexedLayer`` appends them (one narrow tensor per layer)."""


def _indexed(entry: DynamicLayer, keys: torch.Tensor | None) -> DynamicLayer:
    """``entry`` holding the indexer ``keys`` ``(B, n, Di)`` themselves (None: none yet); returns it."""
    if keys is not None:
        entry.indexer_keys, entry.is_indexer_initialized = keys, True
        entry.indexer_dtype, entry.indexer_device = keys.dtype, keys.device
    return entry


def indexer_keys(cache: Cache, length: int) -> list[torch.Tensor | None] | None:
    """Per KV layer, the indexer keys ``(B, length, Di)`` of the first ``length`` slots (views; None in a layer that
    has none yet), or None for a model without sparse selection."""
    found = [entry for entry in entries(cache) if isinstance(entry, DynamicIndexedLayer)]
    if not found:
        return None
    return [entry.indexer_keys[:, :length] if entry.is_indexer_initialized else None for entry in found]


def entries(cache: Cache) -> list:
    """The layers of ``cache`` that hold K/V, in order (kvviz's layer axis): all of them, except a hybrid model's
    recurrent layers."""
    return [entry for entry in cache.layers if not isinstance(entry, LinearAttentionCacheLayerMixin)]


def reserve(cache: Cache, capacity: int) -> None:
    """Room for ``capacity`` slots in every started :class:`RoomyLayer` (a chunked prefill allocates once, not once
    per chunk)."""
    for entry in entries(cache):
        if isinstance(entry, RoomyLayer) and entry.is_initialized and not entry._fits(capacity):
            _regrow(entry, capacity)


def own(cache: Cache) -> None:
    """Buffers of their own for the :class:`RoomyLayer` s of ``cache`` that are rows of a buffer shared by a batch of
    sessions (:mod:`kvviz.runs.lockstep`): their cached slots copied, with a quarter more room; the batch's buffer is
    freed once no session holds a row of it."""
    for entry in entries(cache):
        buffers = entry._buffers if isinstance(entry, RoomyLayer) and entry.is_initialized else None
        if buffers is not None and any(b.untyped_storage().nbytes() > b.numel() * b.element_size() for b in buffers):
            length = entry.get_seq_length()
            _regrow(entry, length + max(length // 4, 64))


def _regrow(entry: RoomyLayer, capacity: int) -> None:
    length = entry.get_seq_length()
    entry._buffers = tuple(_grown(t, length, t, capacity) for t in (entry.keys, entry.values))
    entry.keys, entry.values = (buffer[:, :, :length] for buffer in entry._buffers)


def _grown(old: torch.Tensor, length: int, new: torch.Tensor, capacity: int) -> torch.Tensor:
    """A buffer ``(B, KV, capacity, D)`` like ``new`` holding the first ``length`` slots of ``old`` (``(B, KV, ≥ length,
    D)``, or the 1-D empty tensor of a fresh layer)."""
    batch, heads, _, dim = new.shape
    buffer = new.new_empty(batch, heads, capacity, dim)
    if length:
        buffer[:, :, :length] = old[:, :, :length]
    return buffer


def share(caches: list[Cache], length: int, capacity: int) -> list[KV]:
    """Per layer, buffers ``(B, KV, capacity, D)`` whose row ``i`` holds the first ``length`` slots of ``caches[i]``
    (a batch of sessions, :mod:`kvviz.runs.lockstep`); every cache's :class:`RoomyLayer` s become views of its row,
    so their updates write there. :func:`own` gives a cache buffers of its own again."""
    buffers = []
    for layer in zip(*(entries(cache) for cache in caches)):
        keys, values = layer[0].keys, layer[0].values  # (1, KV, ≥ length, D)
        pair = (keys.new_empty(len(caches), keys.shape[1], capacity, keys.shape[3]),
                values.new_empty(len(caches), values.shape[1], capacity, values.shape[3]))
        for row, entry in enumerate(layer):
            for buffer, old in zip(pair, (entry.keys, entry.values)):
                buffer[row, :, :length] = old[0, :, :length]
            entry._buffers = tuple(buffer[row:row + 1] for buffer in pair)
        buffers.append(pair)
    extend(caches, buffers, length)
    return buffers


def extend(caches: list[Cache], buffers: list[KV], length: int) -> None:
    """Point each cache of a :func:`share` batch at the first ``length`` slots of its row of ``buffers`` (after a
    batched pass wrote its new slots there)."""
    for row, cache in enumerate(caches):
        for entry, (keys, values) in zip(entries(cache), buffers):
            entry.keys, entry.values = keys[row:row + 1, :, :length], values[row:row + 1, :, :length]


def shared(caches: list[Cache], buffers: list[KV]) -> bool:
    """Whether every cache's layers are still views of its row of ``buffers`` (:func:`share`): nothing reallocated
    them since."""
    return all(entry.keys.data_ptr() == keys[row].data_ptr() and entry.values.data_ptr() == values[row].data_ptr()
               for row, cache in enumerate(caches) for entry, (keys, values) in zip(entries(cache), buffers))


def compact_memo(cache: Cache) -> dict[int, object]:
    """A ``copy.deepcopy`` memo under which a copy of ``cache`` holds each :class:`RoomyLayer`'s cached slots alone:
    not its spare room, nor the other rows of a buffer shared by a batch of sessions (:mod:`kvviz.runs.lockstep`)."""
    memo: dict[int, object] = {}
    for entry in entries(cache):
        if isinstance(entry, RoomyLayer) and entry._buffers is not None and entry.keys.dim() == 4:
            keys, values = entry.keys.clone(), entry.values.clone()
            memo[id(entry.keys)], memo[id(entry.values)], memo[id(entry._buffers)] = keys, values, (keys, values)
    return memo


def layer_kv(cache: Cache, layer: int) -> KV:
    """Keys and values of ``layer``: two ``(B, KV, n, D)`` tensors."""
    entry = entries(cache)[layer]
    return entry.keys, entry.values


def truncate(cache: Cache, length: int) -> None:
    """Keep the first ``length`` slots of every layer (layers a failed pass already extended are cut back)."""
    for entry in entries(cache):
        if entry.is_initialized and entry.keys.dim() == 4 and entry.keys.shape[2] > length:
            entry.keys = entry.keys[:, :, :length]
            entry.values = entry.values[:, :, :length]
        if getattr(entry, "is_indexer_initialized", False) and entry.indexer_keys.shape[1] > length:
            entry.indexer_keys = entry.indexer_keys[:, :length]


def nbytes(cache: Cache) -> int:
    """Bytes held by keys and values over all layers (the cached slots; not a :class:`RoomyLayer`'s spare room), and
    by a DSA model's indexer keys."""
    return sum(
        t.numel() * t.element_size() for e in entries(cache) if e.is_initialized for t in (e.keys, e.values)
    ) + sum(e.indexer_keys.numel() * e.indexer_keys.element_size() for e in entries(cache)
            if getattr(e, "is_indexer_initialized", False))


def _every_slot(config: PretrainedConfig, layer: type[DynamicLayer]) -> DynamicCache:
    """An empty ``DynamicCache`` for ``config`` whose KV layers are all ``layer`` (a hybrid's recurrent layers stay as
    transformers makes them): sliding-window layers too keep every slot (their window is the model's attention mask
    over absolute slots, and kvviz shows what they no longer see)."""
    cache = DynamicCache(config=config)
    cache.layers = [entry if isinstance(entry, LinearAttentionCacheLayerMixin) else _kind(layer, entry)()
                    for entry in cache.layers]
    return cache


def _kind(layer: type[DynamicLayer], made: DynamicLayer) -> type[DynamicLayer]:
    """``layer``, or its indexed kind where transformers made an indexed layer (sparse selection)."""
    if not isinstance(made, DynamicIndexedLayer):
        return layer
    return RoomyIndexedLayer if issubclass(layer, RoomyLayer) else DynamicIndexedLayer


def build(config: PretrainedConfig, tensors: list[KV], indexed: list[torch.Tensor | None] | None = None
          ) -> DynamicCache:
    """A new ``DynamicCache`` holding the given per-layer ``(keys, values)`` themselves, not copies: ``update``
    concatenates into new tensors, so a forward pass on this cache never writes to the given ones. ``indexed``: per
    layer, a DSA model's indexer keys ``(B, n, Di)`` of those slots (:func:`indexer_keys`)."""
    cache = _every_slot(config, DynamicLayer)
    for entry, (keys, values), index in zip(entries(cache), tensors, indexed or [None] * len(tensors), strict=True):
        entry.device, entry.is_initialized = keys.device, True  # lazy_initialization, without its placeholders
        entry.keys, entry.values = keys, values
        _indexed(entry, index)
    return cache


def roomy(config: PretrainedConfig) -> DynamicCache:
    """An empty ``DynamicCache`` for ``config`` whose layers are all :class:`RoomyLayer` (every slot kept, also in
    sliding-window layers)."""
    return _every_slot(config, RoomyLayer)


def over(buffers: list[KV], length: int, cached: list[tuple[KV, KV]] | None = None,
         written: Sequence[Writer] | None = None, recurrent: dict | None = None,
         indexed: list[torch.Tensor | None] | None = None) -> Cache:
    """A cache over the first ``length`` slots of per-layer buffers ``(B, KV, capacity, D)``: a forward pass writes
    its new slots into the buffers (slots ``length..``), without copying the cached ones. ``cached``: the views of
    those slots and of the next one (:func:`leading`) when made before: a cache made over the same buffers again
    costs no operation, and a decode step on it writes its slot without making views. ``written``: per layer, how
    the new slots are stored (:class:`RoomyLayer`). ``recurrent``: a hybrid model's recurrent layers by decoder layer
    (:func:`kvviz.recurrent.layers`), put between the KV layers where the model has them. ``indexed``: per layer, a
    DSA model's indexer keys of the first ``length`` slots (:func:`indexer_keys`; a pass appends to copies)."""
    cached = cached or [None] * len(buffers)
    written = written or [None] * len(buffers)
    kind = RoomyLayer if indexed is None else RoomyIndexedLayer
    kv = iter(_indexed(kind(keys, values, length, views, writer), index) for (keys, values), views, writer, index
              in zip(buffers, cached, written, indexed or [None] * len(buffers)))
    recurrent = recurrent or {}
    return Cache(layers=[recurrent[index] if index in recurrent else next(kv)
                         for index in range(len(buffers) + len(recurrent))])


def leading(buffers: list[KV], length: int) -> list[tuple[KV, KV]]:
    """Per layer, the views of the first ``length`` slots of ``buffers`` ``(B, KV, capacity, D)``, and of slot
    ``length`` (``(B, KV, 1, D)``, None past the capacity)."""
    return [((keys[:, :, :length], values[:, :, :length]),
             (keys[:, :, length:length + 1], values[:, :, length:length + 1]) if length < keys.shape[2] else None)
            for keys, values in buffers]
