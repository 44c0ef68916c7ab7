"""An Edit: which cached slots are evicted (everywhere, or in chosen layers / KV heads), which are stored at fewer
bits (keys and values separately), which key channels are pruned and which evicted values are merged into kept slots
(:mod:`kvviz.edit.parts`). A validated, JSON-serialisable value object; it never touches a cache itself except
through :meth:`Edit.quantized`, which returns new tensors."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property

import torch

from kvviz.edit.parts import (Eviction, Merge, Pruning, check_parts, flags, from_json, index_table, optional, reshaped,
                              slots_of, to_json)
from kvviz.errors import KvvizError
from kvviz.quant.quantizer import Quantizer, check_bits
from kvviz.quant.widths import blocks, check_head_shape, check_head_widths, quantize_slots, width_groups

__all__ = ["Edit", "Eviction", "Merge", "Pruning"]


@dataclass(frozen=True)
class Edit:
    """Evictions plus per-slot bit-widths (absent = 16, untouched), key-channel prunings and value merges. Default
    quantizers follow KIVI: keys per channel, values per token. ``full_precision_window`` keeps the most recent
    slots before the step at 16 bits. Prunings and merges apply first (to the K/V as the model computed them), the
    quantization to their result. ``head_widths`` (mixed precision across layers and KV heads) gives every slot
    that the bit tables quantize the width of its layer and KV head instead (the tables then say which slots).
    ``exact_layers`` are left at the model's precision whatever the tables say (vLLM's
    ``--kv-cache-dtype-skip-layers``: e.g. sliding-window layers kept in 16 bits)."""

    evictions: tuple[Eviction, ...] = ()
    key_bits: Mapping[int, int] = field(default_factory=dict)
    value_bits: Mapping[int, int] = field(default_factory=dict)
    keys: Quantizer = Quantizer(axis="channel")
    values: Quantizer = Quantizer(axis="token")
    full_precision_window: int = 0
    prunings: tuple[Pruning, ...] = ()
    merges: tuple[Merge, ...] = ()
    merge_rule: str = "average"  # "average" (D2O, kvpress' MergingPress) or "add" (CaM)
    head_widths: tuple[tuple[int, ...], ...] | None = None  # per layer, per KV head: the width of quantized slots
    exact_layers: tuple[int, ...] = ()  # layers none of whose slots are quantized

    def __post_init__(self) -> None:
        object.__setattr__(self, "evictions", tuple(self.evictions))
        object.__setattr__(self, "prunings", tuple(self.prunings))
        object.__setattr__(self, "merges", tuple(self.merges))
        for name in ("key_bits", "value_bits"):
            bits = getattr(self, name)
            slots = slots_of(bits.keys(), f"slots in {name}")
            object.__setattr__(self, name, {s: check_bits(bits[s]) for s in slots if bits[s] != 16})
        if self.values.rope is not None:
            raise KvvizError("values carry no RoPE: only keys are quantized before RoPE")
        if isinstance(self.full_precision_window, bool) or not isinstance(self.full_precision_window, int) \
                or self.full_precision_window < 0:
            raise KvvizError(f"the full-precision window must be a non-negative integer, got {self.full_precision_window!r}")
        if self.head_widths is not None:
            object.__setattr__(self, "head_widths", check_head_widths(self.head_widths))
        object.__setattr__(self, "exact_layers", slots_of(self.exact_layers, "layers kept exact"))
        object.__setattr__(self, "_plans", {})  # (kind, n) -> slot groups; not a field: equality and JSON ignore it

    # --- construction ----------------------------------------------------------------------------------------

    @classmethod
    def evict(cls, slots: Iterable[int], layers: Iterable[int] | None = None, heads: Iterable[int] | None = None) -> Edit:
        scope = (None if layers is None else tuple(layers), None if heads is None else tuple(heads))
        return cls(evictions=(Eviction(tuple(slots), *scope),))

    @classmethod
    def quantize(cls, slots: Iterable[int], key_bits: int, value_bits: int | None = None, **settings) -> Edit:
        slots = list(slots)
        value_bits = key_bits if value_bits is None else value_bits
        return cls(key_bits=dict.fromkeys(slots, key_bits), value_bits=dict.fromkeys(slots, value_bits), **settings)

    @classmethod
    def from_evicted(cls, evicted: torch.Tensor) -> Edit:
        """Evictions from a boolean mask ``(L, KV, n)``: one eviction everywhere when every layer and KV head hides
        the same slots, one per layer when the KV heads of each layer agree, else one per (layer, KV head)."""
        layers, heads, _ = evicted.shape
        mask = evicted.cpu()
        if bool((mask == mask[:1, :1]).all()):
            return cls.evict(mask[0, 0].nonzero()[:, 0].tolist()) if bool(mask.any()) else cls()
        per_layer = bool((mask == mask[:, :1]).all())
        evictions = []
        for layer in range(layers):
            for head in range(1 if per_layer else heads):
                slots = mask[layer, head].nonzero()[:, 0].tolist()
                if slots:
                    evictions.append(Eviction(tuple(slots), (layer,), None if per_layer else (head,)))
        return cls(evictions=tuple(evictions))

    def merged(self, other: Edit) -> Edit:
        """This edit with ``other`` on top: evictions, prunings and merges add up, ``other``'s bit-widths win, and
        its quantizers too where it quantizes (else this edit's stay: an eviction on top of a committed quantization
        leaves that quantization as it was). Widths per KV head do not mix with another quantization's."""
        if self.is_empty:
            return other
        quantizing = other.quantizes or other.head_widths is not None
        if quantizing and self.head_widths != other.head_widths and self.quantizes:
            raise KvvizError("a quantization with widths per KV head and another one cannot be combined: undo the "
                             "earlier one first")
        settings = other if quantizing else self
        merged = replace(other, evictions=self.evictions + other.evictions,
                         key_bits={**self.key_bits, **other.key_bits}, value_bits={**self.value_bits, **other.value_bits},
                         prunings=self.prunings + other.prunings, merges=self.merges + other.merges,
                         keys=settings.keys, values=settings.values, head_widths=settings.head_widths,
                         exact_layers=settings.exact_layers,
                         merge_rule=other.merge_rule if other.merges else self.merge_rule)
        if merged.head_widths is not None and merged.reshapes:
            raise KvvizError("widths per KV head and pruned or merged slots cannot be combined: undo one first")
        return merged

    # --- reading ---------------------------------------------------------------------------------------------

    @cached_property
    def key(self) -> tuple:
        """A hashable value equal for equal edits (to key memos on)."""
        return (self.evictions, tuple(self.key_bits.items()), tuple(self.value_bits.items()), self.keys, self.values,
                self.full_precision_window, self.prunings, self.merges, self.merge_rule, self.head_widths,
                self.exact_layers)

    @property
    def is_empty(self) -> bool:
        return not any(e.slots for e in self.evictions) and not self.key_bits and not self.value_bits \
            and not self.reshapes

    @property
    def quantizes(self) -> bool:
        return bool(self.key_bits or self.value_bits)

    @property
    def reshapes(self) -> bool:
        """Whether it prunes key channels or merges values."""
        return bool(self.prunings or self.merges)

    @property
    def rewrites(self) -> bool:
        """Whether the K/V it leaves differ from the model's anywhere (quantized, pruned or merged)."""
        return self.quantizes or self.reshapes

    def evicted_slots(self) -> set[int]:
        """Slots evicted in at least one layer / KV head (merge sources too)."""
        return {s for e in self.evictions for s in e.slots} | {m.source for m in self.merges}

    def rewritten_slots(self) -> set[int]:
        """Slots whose K/V this edit changes: quantized, pruned or merged into."""
        return set(self.key_bits) | set(self.value_bits) | {s for p in self.prunings for s in p.slots} \
            | {m.target for m in self.merges}

    def touched_slots(self) -> set[int]:
        return self.evicted_slots() | self.rewritten_slots()

    def validate(self, at: int, layers: int, kv_heads: int, head_dim: int | tuple[int, int]) -> None:
        """Refuse slots that are not in the cache before ``at``, evicting ``at`` itself, scopes out of range and
        group sizes that do not divide ``head_dim`` (or, as a pair, the widths of the cached keys and values: a
        latent and a RoPE key with latent attention)."""
        head_dim, value_dim = (head_dim, head_dim) if isinstance(head_dim, int) else head_dim
        for slot in sorted(self.touched_slots()):
            if slot == at:
                raise KvvizError(f"slot {slot} is the token being processed; it cannot be evicted or quantized")
            if slot > at:
                raise KvvizError(f"slot {slot} is not in the cache before slot {at}")
        for eviction in self.evictions:
            if eviction.layers and eviction.layers[-1] >= layers:
                raise KvvizError(f"layer {eviction.layers[-1]} does not exist (the model has {layers})")
            if eviction.heads and eviction.heads[-1] >= kv_heads:
                raise KvvizError(f"KV head {eviction.heads[-1]} does not exist (the model has {kv_heads})")
        if self.exact_layers and self.exact_layers[-1] >= layers:
            raise KvvizError(f"layer {self.exact_layers[-1]} does not exist (the model has {layers}): it cannot be "
                             "kept exact")
        self.keys.check_model(layers, kv_heads, head_dim)
        self.values.check_model(layers, kv_heads, value_dim)
        for quantizer, table in ((self.keys, self.key_bits), (self.values, self.value_bits)):
            for bits in set(table.values()) if self.head_widths is None else {w for r in self.head_widths for w in r}:
                quantizer.check_bits(bits)
        if self.head_widths is not None:
            check_head_shape(self.head_widths, layers, kv_heads, self.keys, self.values, self.reshapes)
        if self.reshapes or self.merge_rule != "average":
            check_parts(self.prunings, self.merges, self.merge_rule, at, layers, kv_heads, head_dim,
                        self.evicted_mask(at, layers, kv_heads))
        if at > 0 and (self.evictions or self.merges):
            kept = (~self.evicted_mask(at, layers, kv_heads)).sum(-1)  # (L, KV) slots left before the step
            if bool((kept == 0).any()):
                layer, head = (int(i) for i in (kept == 0).nonzero()[0])
                raise KvvizError(f"the edit evicts every cached slot of layer {layer}, KV head {head}; keep at least one")

    def evicted_mask(self, n: int, layers: int, kv_heads: int, device: torch.device | None = None) -> torch.Tensor:
        """Boolean ``(L, KV, n)``: True where slot ``j`` is evicted from that layer and KV head (computed once per
        shape and device; do not modify it)."""
        key = ("mask", n, layers, kv_heads, str(device))
        if key not in self._plans:
            self._plans[key] = self._evicted_mask(n, layers, kv_heads, device)
        return self._plans[key]

    def _evicted_mask(self, n: int, layers: int, kv_heads: int, device: torch.device | None) -> torch.Tensor:
        mask = torch.zeros(layers, kv_heads, n, dtype=torch.bool, device=device)
        scopes: dict[tuple, list[int]] = {}  # evictions of one scope share their slots (a file may hold thousands)
        for eviction in self.evictions:
            scopes.setdefault((eviction.layers, eviction.heads), []).extend(eviction.slots)
        if scopes:  # per (layer, KV head): the slots of every scope that holds it, one index_put each
            in_scope = torch.stack([flags(layers, scope_layers, None)[:, None] & flags(kv_heads, scope_heads, None)
                                    for scope_layers, scope_heads in scopes])  # (G, L, KV)
            group = torch.repeat_interleave(torch.arange(len(scopes)), torch.tensor([len(s) for s in scopes.values()]))
            slot = torch.tensor([s for slots in scopes.values() for s in slots], dtype=torch.long)  # (M,)
            group, slot = group[slot < n], slot[slot < n]
            for layer, head in in_scope.any(0).nonzero().tolist():
                mask[layer, head, slot[in_scope[group, layer, head]].to(device)] = True
        merged = [(m.layer, m.head, m.source) for m in self.merges  # a merged slot leaves its layer and KV head
                  if m.source < n and m.layer < layers and m.head < kv_heads]
        if merged:  # one index_put for all of them (a file may hold many)
            mask[index_table(merged, 3).to(device).unbind(1)] = True
        return mask

    def resolved(self, at: int) -> Edit:
        """This edit for the step at slot ``at``: the full-precision window becomes explicit 16-bit slots."""
        recent = at - self.full_precision_window
        if not self.full_precision_window and all(next(reversed(b), -1) < at for b in (self.key_bits, self.value_bits)):
            return self  # nothing to resolve (the bit tables are sorted by slot)
        keep = lambda bits: {s: b for s, b in bits.items() if s < recent}  # noqa: E731
        return replace(self, key_bits=keep(self.key_bits), value_bits=keep(self.value_bits), full_precision_window=0)

    def quantized(self, keys: torch.Tensor, values: torch.Tensor, layer: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """New ``(KV, n, D)`` keys and values of ``layer`` as this edit stores them: pruned and merged, then each
        slot fake-quantized at its bit-width (slots sharing a bit-width are quantized together, which matters for
        per-channel scales); what it leaves alone is returned as it is. ``layer`` is needed only by an edit that
        prunes or merges (they are per layer) or quantizes with static scales (per layer and KV head)."""
        if self.reshapes:
            if layer is None:
                raise ValueError("an edit that prunes or merges needs the layer of the K/V it is applied to")
            keys, values = reshaped(keys, values, layer, self.prunings, self.merges, self.merge_rule)
        return self._quantized(keys, "key", layer), self._quantized(values, "value", layer)

    def quantized_keys(self, keys: torch.Tensor, layer: int | None = None) -> torch.Tensor:
        """New ``(KV, n, D)`` keys of ``layer`` as this edit stores them (pruned, then quantized)."""
        if self.prunings:
            if layer is None:
                raise ValueError("an edit that prunes needs the layer of the keys it is applied to")
            keys = reshaped(keys, keys[:, :0], layer, self.prunings, (), self.merge_rule)[0]
        return self._quantized(keys, "key", layer)

    def quantized_values(self, values: torch.Tensor, layer: int | None = None) -> torch.Tensor:
        """New ``(KV, n, D)`` values of ``layer`` as this edit stores them (quantized; merges are not applied)."""
        return self._quantized(values, "value", layer)

    def quantize_(self, keys: torch.Tensor, values: torch.Tensor, source: tuple[torch.Tensor, torch.Tensor] | None = None,
                  layer: int | None = None) -> None:
        """:meth:`quantized` in place, on tensors the caller owns (e.g. the slots of a cache built for one run); with
        ``source`` (keys, values of the same shapes), its quantized slots are written into them instead (one pass
        less than a copy and a quantization). ``layer``: that of the ``(KV, n, D)`` K/V, or None for every layer's
        rows ``(L·KV, n, D)`` (static scales need to know which; an edit that keeps layers exact needs ``layer``)."""
        self._quantize_(keys, "key", None if source is None else source[0], layer)
        self._quantize_(values, "value", None if source is None else source[1], layer)

    def _quantized(self, x: torch.Tensor, kind: str, layer: int | None) -> torch.Tensor:
        if not self.groups(kind, x.shape[1]) or layer in self.exact_layers:
            return x
        out = x.clone()
        self._quantize_(out, kind, layer=layer)
        return out

    def _quantize_(self, x: torch.Tensor, kind: str, source: torch.Tensor | None = None, layer: int | None = None
                   ) -> None:
        quantizer = self.keys if kind == "key" else self.values
        source = x if source is None else source
        if self.exact_layers and layer is None:
            raise ValueError("an edit that keeps layers exact quantizes one layer at a time: give the layer")
        if layer in self.exact_layers:
            if source is not x:
                x.copy_(source)
            return
        for width, slots in self.groups(kind, x.shape[1]):
            parts = [slots]
            if quantizer.axis == "channel" and quantizer.block:  # one scale per block of slots (KIVI)
                parts = blocks(range(x.shape[1])[slots] if isinstance(slots, slice) else slots, quantizer.block)
            for part in parts:
                quantize_slots(x, part, width, quantizer, source, layer, self.head_widths)

    def groups(self, kind: str, n: int) -> list[tuple[int, slice | list[int]]]:
        """The slots below ``n`` that ``kind`` (``"key"`` or ``"value"``) stores at fewer than 16 bits, as
        ``(bit-width, slots)`` groups (see :func:`~kvviz.quant.widths.width_groups`); computed once per ``n`` (every
        layer uses the same)."""
        if (kind, n) not in self._plans:
            self._plans[kind, n] = width_groups(self.key_bits if kind == "key" else self.value_bits, n)
        return self._plans[kind, n]

    # --- JSON ------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "evict": [asdict(e) for e in self.evictions],
            "key_bits": {str(s): b for s, b in self.key_bits.items()},
            "value_bits": {str(s): b for s, b in self.value_bits.items()},
            "keys": _quantizer_fields(self.keys),
            "values": _quantizer_fields(self.values),
            "full_precision_window": self.full_precision_window,
        } | ({"head_widths": self.head_widths} if self.head_widths is not None else {}) \
            | ({"exact_layers": list(self.exact_layers)} if self.exact_layers else {}) \
            | (to_json(self.prunings, self.merges) | {"merge_rule": self.merge_rule} if self.reshapes else {})

    @classmethod
    def from_dict(cls, data: Mapping) -> Edit:
        """Inverse of :meth:`to_dict`; malformed input raises :class:`KvvizError`."""
        try:
            prunings, merges = from_json(data)
            return cls(
                evictions=tuple(Eviction(tuple(e["slots"]), optional(e.get("layers")), optional(e.get("heads")))
                                for e in data.get("evict", [])),
                key_bits={int(s): b for s, b in data.get("key_bits", {}).items()},
                value_bits={int(s): b for s, b in data.get("value_bits", {}).items()},
                keys=Quantizer(**data.get("keys", {"axis": "channel"})),
                values=Quantizer(**data.get("values", {"axis": "token"})),
                full_precision_window=data.get("full_precision_window", 0),
                prunings=prunings, merges=merges, merge_rule=data.get("merge_rule", "average"),
                head_widths=data.get("head_widths"), exact_layers=data.get("exact_layers", ()),
            )
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            if isinstance(exc, KvvizError):
                raise
            raise KvvizError(f"malformed edit: {exc}") from exc


def _quantizer_fields(quantizer: Quantizer) -> dict:
    """A quantizer's fields as JSON values (lists, not tuples); ``no_rope`` only where a model has layers without
    RoPE, so that other documents read as they did."""
    fields = json.loads(json.dumps(asdict(quantizer)))
    if not fields["no_rope"]:
        del fields["no_rope"]
    return fields
