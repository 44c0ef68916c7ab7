"""Cache bytes (seed §13): the full cache at the model's dtype and at fp16, and an edited cache as really packed —
evicted entries gone, quantized ones as bit-packed codes plus fp16 scales / zero points."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvviz.edits import Edit
from kvviz.quant import packed_bytes


def _edited_bytes(edit: Edit, evicted: torch.Tensor, slots: Sequence[int], head_dim: int, native: int) -> int:
    """Packed bytes of ``slots`` over all layers and KV heads (``evicted``: bool ``(L, KV, n)``)."""
    kept = ~evicted[:, :, list(slots)].cpu()  # (L, KV, len(slots))
    total = 0
    for kind, quantizer in (("key", edit.keys), ("value", edit.values)):
        bits = torch.tensor(edit.bits(kind, evicted.shape[2]))[list(slots)]
        for width in bits.unique().tolist():
            counts = (kept & (bits == width)).sum(-1).flatten().tolist()  # retained slots per (layer, KV head)
            total += sum(packed_bytes(count, width, head_dim, quantizer, native) for count in counts)
    return total


def cache_memory(
    edit: Edit, evicted: torch.Tensor, segments: Sequence[str], head_dim: int, dtype: torch.dtype
) -> dict:
    """Bytes of the ``n = len(segments)`` cached slots: ``full_bytes`` (model dtype), ``fp16_bytes`` and
    ``edited_bytes`` (``edit`` resolved, ``evicted`` bool ``(L, KV, n)``), plus the same per segment.

    Per-segment edited bytes count each segment as if packed on its own, so per-channel scales shared across segments
    are counted once per segment there (the total counts them once).
    """
    layers, kv_heads, n = evicted.shape
    native = torch.empty((), dtype=dtype).element_size()
    elements_per_slot = 2 * layers * kv_heads * head_dim  # keys and values

    def summary(slots: list[int]) -> dict:
        return {"slots": len(slots), "full_bytes": len(slots) * elements_per_slot * native,
                "fp16_bytes": len(slots) * elements_per_slot * 2,
                "edited_bytes": _edited_bytes(edit, evicted, slots, head_dim, native) if slots else 0}

    result = summary(list(range(n)))
    result["segments"] = {
        name: summary([slot for slot, segment in enumerate(segments) if segment == name])
        for name in dict.fromkeys(segments)
    }
    return result


def step_memory(session, edit: Edit, at: int) -> dict:
    """:func:`cache_memory` of the cache before slot ``at`` with ``edit`` (validated) on top of the committed one."""
    lm = session.lm
    edit.validate(at, lm.layers, lm.kv_heads, lm.head_dim)
    _, edited = session.commits.step_edits(at, edit)
    evicted = edited.evicted_mask(at, lm.layers, lm.kv_heads)
    return cache_memory(edited, evicted, session.transcript.segments()[:at], lm.head_dim, lm.dtype)
