"""Cache bytes (docs/math.md §4): the full cache at the model's dtype and at fp16, and an edited cache as really
packed — evicted entries gone, quantized ones as bit-packed codes plus fp16 scales / zero points, pruned key channels
of unquantized keys gone (ThinK's thinner keys; kvpress zeroes them in place and saves nothing). A sliding-window
layer counts only the slots it still holds (its window's), as a model's own cache keeps them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from kvviz.edit.check import check_edit
from kvviz.edit.edit import Edit
from kvviz.quant.quantizer import layer_scale_bytes, packed_bytes
from kvviz.session import Session


@dataclass(frozen=True)
class CacheBytes:
    """Bytes of ``slots`` cached slots: at the model's dtype, at fp16, and packed as an edit stores them; for a whole
    cache also the same per segment (``history``, ``query``, ``generated``) and the slots each layer holds."""

    slots: int
    full_bytes: int
    fp16_bytes: int
    edited_bytes: int
    segments: dict[str, CacheBytes] = field(default_factory=dict)
    layer_slots: list[int] = field(default_factory=list)  # per layer: the slots it holds (fewer in a window)

    def to_dict(self) -> dict:
        """JSON-ready; ``segments`` and ``layer_slots`` only where there are some."""
        own = {"slots": self.slots, "full_bytes": self.full_bytes, "fp16_bytes": self.fp16_bytes,
               "edited_bytes": self.edited_bytes}
        return own | ({"segments": {k: v.to_dict() for k, v in self.segments.items()}} if self.segments else {}) \
            | ({"layer_slots": self.layer_slots} if self.layer_slots else {})


def _packed(counts: torch.Tensor, width: int, head_dim: int, quantizer, native: int) -> int:
    """Sum of :func:`packed_bytes` over ``counts`` (retained slots per KV head), each distinct count computed once."""
    values, times = torch.unique(counts, return_counts=True)
    return sum(packed_bytes(c, width, head_dim, quantizer, native) * t
               for c, t in zip(values.tolist(), times.tolist()))  # two reads of the device, not two per count


def _longs(values: Iterable[int], count: int) -> torch.Tensor:
    """``count`` ints as a tensor, through numpy: ``torch.tensor`` of a 1k-long list took ~0.15 ms, ~10× longer."""
    return torch.from_numpy(np.fromiter(values, np.int64, count))


def _widths(table: Mapping[int, int], n: int) -> torch.Tensor:
    """Bit-width ``(n,)`` of each slot below ``n`` from a resolved edit's table (slots not in it are 16-bit)."""
    bits = torch.full((n,), 16, dtype=torch.long)
    if table:
        slots, widths = _longs(table, len(table)), _longs(table.values(), len(table))
        bits[slots[slots < n]] = widths[slots < n]
    return bits


def cache_memory(
    edit: Edit, evicted: torch.Tensor, segments: Sequence[str], widths: tuple[int, int], dtype: torch.dtype,
    outside: torch.Tensor | None = None,
) -> CacheBytes:
    """Bytes of the ``n = len(segments)`` cached slots: at the model's dtype, at fp16 and packed with ``edit``
    (resolved; ``evicted`` bool ``(L, KV, n)``), plus the same per segment. ``outside`` (bool ``(L, n)``) marks the
    slots a layer's sliding window no longer holds: they count nowhere. ``widths``: the channels of one cached key and
    one cached value per KV head (:attr:`Geometry.cached_widths`; a latent and a RoPE key with latent attention).

    Per-segment edited bytes count each segment as if packed on its own, so per-channel scales shared across segments
    are counted once per segment there (the total counts them once).
    """
    layers, kv_heads, n = evicted.shape
    native = torch.empty((), dtype=dtype).element_size()
    slot_elements = kv_heads * sum(widths)  # keys and values of one slot in one layer
    names = list(dict.fromkeys(segments))
    index = {name: i for i, name in enumerate(names)}
    segment_of = _longs(map(index.__getitem__, segments), n)  # (n,)
    held = torch.ones(layers, n, dtype=torch.bool) if outside is None else ~outside.cpu()  # (L, n)
    held_per_segment = torch.zeros(layers, len(names), dtype=torch.long).index_add_(1, segment_of, held.long())
    kept = (~evicted.cpu() & held[:, None]).reshape(layers * kv_heads, n)
    edited = dict.fromkeys([None, *names], 0)  # None: all slots
    native_per_segment = None  # retained slots per segment, for a kind nothing of which is quantized
    for kind, quantizer, head_dim in (("key", edit.keys, widths[0]), ("value", edit.values, widths[1])):
        table = edit.key_bits if kind == "key" else edit.value_bits
        if not table:  # every retained slot at the model's dtype: bytes in proportion to the slots (both kinds alike)
            if native_per_segment is None:
                native_per_segment = torch.zeros(len(names), dtype=torch.long).index_add_(
                    0, segment_of, kept.sum(0)).tolist()
            for name, count in zip(names, native_per_segment):
                edited[name] += count * head_dim * native
            edited[None] += sum(native_per_segment) * head_dim * native
            continue
        bits = _widths(table, n)
        if edit.head_widths is not None:  # (L·KV, n): a quantized slot takes its layer's and KV head's width
            own = torch.tensor(edit.head_widths, dtype=torch.long).reshape(-1, 1)
            bits = torch.where(bits < 16, own, 16)
        if edit.exact_layers:  # (L·KV, n): those layers' slots at the model's dtype
            bits = bits.expand(layers * kv_heads, n).clone().view(layers, kv_heads, n)
            bits[list(edit.exact_layers)] = 16
            bits = bits.view(layers * kv_heads, n)
        for width in bits.unique().tolist():
            chosen = (kept & (bits == width)).int()  # (L·KV, n): retained slots at this width
            per_segment = torch.zeros(layers * kv_heads, len(names), dtype=torch.int).index_add_(1, segment_of, chosen)
            edited[None] += _packed(per_segment.sum(1), width, head_dim, quantizer, native)
            for index, name in enumerate(names):
                edited[name] += _packed(per_segment[:, index], width, head_dim, quantizer, native)
            if quantizer.per_layer and width < 16:  # one scale per layer holding some of these slots
                layered = per_segment.view(layers, kv_heads, len(names)).sum(1) > 0  # (L, segments)
                edited[None] += int(layered.any(1).sum()) * layer_scale_bytes(quantizer)
                for index, name in enumerate(names):
                    edited[name] += int(layered[:, index].sum()) * layer_scale_bytes(quantizer)

    key_bits = _widths(edit.key_bits, n) if edit.prunings else None
    for pruning in edit.prunings:  # stored thin, as ThinK stores them: a pruned channel of a 16-bit key costs nothing
        slots = _longs((s for s in pruning.slots if s < n), sum(s < n for s in pruning.slots))
        thin = slots[kept[pruning.layer * kv_heads + pruning.head, slots] & (key_bits[slots] == 16)]
        for name in (None, *(names[i] for i in segment_of[thin].unique().tolist())):
            count = len(thin) if name is None else int((segment_of[thin] == names.index(name)).sum())
            edited[name] -= count * len(pruning.channels) * native

    def summary(name: str | None, slots: int, held_slots: int, **parts) -> CacheBytes:
        elements = held_slots * slot_elements  # over the layers
        return CacheBytes(slots, elements * native, elements * 2, edited[name], **parts)

    per_segment = {name: summary(name, segments.count(name), int(held_per_segment[:, i].sum()))
                   for i, name in enumerate(names)}
    return summary(None, n, int(held.sum()), segments=per_segment, layer_slots=held.sum(1).tolist())


def step_memory(session: Session, edit: Edit, at: int) -> CacheBytes:
    """:func:`cache_memory` of the cache before slot ``at`` with ``edit`` (validated) on top of the committed one."""
    lm = session.lm
    check_edit(lm, session.transcript, edit, at)
    _, edited = session.commits.step_edits(at, edit)
    evicted = edited.evicted_mask(at, lm.layers, lm.kv_heads)
    return cache_memory(edited, evicted, session.transcript.segments()[:at], lm.geometry.cached_widths, lm.dtype,
                        lm.attention.outside(at, at))
