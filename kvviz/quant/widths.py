"""Which slots an :class:`~kvviz.edit.edit.Edit` stores at which bit-width: the slots grouped by width (one quantization
each, which matters for scales shared across slots), and mixed precision across layers and KV heads — one width per
(layer, KV head) for every slot the edit quantizes (``Edit.head_widths``, chosen by kvviz.quant.allocation)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, check_bits, fake_quantize, fake_quantize_, per_head_table


def check_head_widths(widths: object) -> tuple[tuple[int, ...], ...]:
    """``widths`` as a tuple per layer of one supported bit-width per KV head (the same count in every layer)."""
    return per_head_table(widths, check_bits, "widths per head")


def check_head_shape(widths: tuple[tuple[int, ...], ...], layers: int, kv_heads: int, keys: Quantizer,
                     values: Quantizer, reshapes: bool) -> None:
    """Refuse widths per head that do not fit a model of ``layers`` × ``kv_heads``, or that the quantizers cannot
    take: static scales and one scale per layer span KV heads stored at other widths."""
    if (len(widths), len(widths[0])) != (layers, kv_heads):
        raise KvvizError(f"the widths per head are for {len(widths)} layers of {len(widths[0])} KV heads; this model "
                         f"has {layers} layers of {kv_heads}")
    if any(q.scales is not None or q.per_layer for q in (keys, values)) or reshapes:
        raise KvvizError("widths per KV head take quantizers per channel, token or KV head (no scale per layer, "
                         "as NVFP4's), and no pruning or merging in the same edit")


def quantize_slots(x: torch.Tensor, slots: slice | list[int], width: int, quantizer: Quantizer, source: torch.Tensor,
                   layer: int | None, head_widths: tuple[tuple[int, ...], ...] | None) -> None:
    """``x[:, slots]`` ← ``source[:, slots]`` quantized, for rows ``(KV, n, D)`` of ``layer`` (or every layer's
    ``(L·KV, n, D)`` with ``layer`` None): at ``width``, or with ``head_widths`` at each row's own width (16: as is)."""
    positions = None if quantizer.rope is None else torch.arange(x.shape[1], device=x.device)[slots]  # = slots
    if head_widths is None:
        if isinstance(slots, slice):
            fake_quantize_(x[:, slots], width, quantizer, source[:, slots], layer, positions)
        else:
            x[:, slots] = fake_quantize(source[:, slots], width, quantizer, layer, positions)
        return
    rows = torch.tensor(head_widths if layer is None else head_widths[layer], device=x.device).reshape(-1)
    columns = torch.arange(x.shape[1], device=x.device)[slots]
    for row_width in rows.unique().tolist():
        chosen = (rows == row_width).nonzero()[:, 0]
        part = source[chosen][:, columns]  # (rows, slots, D)
        x[chosen[:, None], columns] = fake_quantize(part, row_width, quantizer, layer, positions)


def width_groups(bits: Mapping[int, int], n: int) -> list[tuple[int, slice | list[int]]]:
    """The slots below ``n`` stored at fewer than 16 bits, grouped by bit-width: a slice where they are contiguous
    (no gather or scatter needed), else a list of slots. ``bits`` has sorted keys and no 16s (see ``Edit``)."""
    by_width: dict[int, list[int]] = {}
    for slot, width in bits.items():
        if slot < n:
            by_width.setdefault(width, []).append(slot)
    return [(width, slice(slots[0], slots[-1] + 1) if slots[-1] - slots[0] + 1 == len(slots) else slots)
            for width, slots in sorted(by_width.items())]


def blocks(slots: Iterable[int], block: int) -> list[slice | list[int]]:
    """Sorted ``slots`` split by ``slot // block``, each part a slice when contiguous (else a list)."""
    parts: dict[int, list[int]] = {}
    for slot in slots:
        parts.setdefault(slot // block, []).append(slot)
    return [slice(p[0], p[-1] + 1) if p[-1] - p[0] + 1 == len(p) else p for p in parts.values()]
