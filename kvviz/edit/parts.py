"""The parts of an :class:`~kvviz.edit.edit.Edit` besides bit-widths, each a validated, JSON-ready value:

- an :class:`Eviction` hides slots (everywhere, or in chosen layers / KV heads);
- a :class:`Pruning` zeroes key channels of some slots in one layer and KV head — ThinK's channel pruning (Xu et al.,
  "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR 2025): the dropped channels' products leave every
  attention score, ``q·k̂ = Σ_{c kept} q_c k_c``;
- a :class:`Merge` folds an evicted slot's value into a kept slot's in one layer and KV head and evicts the source
  there — D2O (Wan et al. 2024) and kvpress' ``MergingPress`` with ``rule="average"``: ``v̂_t = (v_t + Σ_s w_s v_s) /
  (1 + Σ_s w_s)``; CaM (Zhang et al., ICML 2024) with ``rule="add"``: ``v̂_t = v_t + Σ_s w_s v_s``. Keys stay.

:func:`reshaped` applies prunings and merges to one layer's keys and values (docs/math.md §4: a merged or pruned
cache is another cache, and the what-if's split into a weight and a content term holds for it unchanged).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain

import torch

from kvviz.errors import KvvizError

MERGE_RULES = ("average", "add")
MAX_MERGE_WEIGHT = 1e6  # policies weigh a merge by a cosine times a norm ratio, within [0, 1]; up to 1e6 (and the
#                         context window's sources on one target) the merged values stay finite in float32


def slots_of(values: Iterable[object], what: str) -> tuple[int, ...]:
    """Sorted distinct non-negative ints; anything else is refused naming ``what``."""
    result = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KvvizError(f"{what} must be non-negative integers, got {value!r}")
        result.append(value)
    return tuple(sorted(set(result)))


def _index(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KvvizError(f"{what} must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Eviction:
    """Slots removed from the given layers and KV heads (``None`` = all of them)."""

    slots: tuple[int, ...]
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", slots_of(self.slots, "evicted slots"))
        for name in ("layers", "heads"):
            scope = getattr(self, name)
            if scope is not None:
                scope = slots_of(scope, name)
                if not scope:
                    raise KvvizError(f"the eviction's {name} scope is empty; give at least one or leave it unset")
                object.__setattr__(self, name, scope)

    @property
    def everywhere(self) -> bool:
        return self.layers is None and self.heads is None


@dataclass(frozen=True)
class Pruning:
    """Key ``channels`` zeroed in ``slots`` of one ``layer`` and KV ``head``."""

    layer: int
    head: int
    channels: tuple[int, ...]
    slots: tuple[int, ...]

    def __post_init__(self) -> None:
        _index(self.layer, "a pruning's layer"), _index(self.head, "a pruning's KV head")
        for name in ("channels", "slots"):
            object.__setattr__(self, name, slots_of(getattr(self, name), f"pruned {name}"))
            if not getattr(self, name):
                raise KvvizError(f"a pruning needs at least one of its {name}")


@dataclass(frozen=True)
class Merge:
    """Slot ``source``'s value folded into slot ``target``'s with ``weight`` in one ``layer`` and KV ``head``; the
    source is evicted there. Merges of a later ``round`` read the values the earlier rounds left (a policy run that
    merges at every turn's prompt: round = turn)."""

    layer: int
    head: int
    source: int
    target: int
    weight: float
    round: int = 0

    def __post_init__(self) -> None:
        layer, head, source, target, round_ = self.layer, self.head, self.source, self.target, self.round
        if not (type(layer) is type(head) is type(source) is type(target) is type(round_) is int  # the usual case,
                and min(layer, head, source, target, round_) >= 0):  # cheaply (a session file may hold many)
            for name in ("layer", "head", "source", "target", "round"):
                _index(getattr(self, name), f"a merge's {name}")
        if self.source == self.target:
            raise KvvizError(f"slot {self.source} cannot be merged into itself")
        weight = self.weight
        if type(weight) is float and 0 <= weight <= MAX_MERGE_WEIGHT:
            return
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= MAX_MERGE_WEIGHT:
            raise KvvizError(f"a merge's weight must be a finite non-negative number of at most {MAX_MERGE_WEIGHT:g} "
                             f"(the merged values must stay finite in float32), got {weight!r}")
        object.__setattr__(self, "weight", float(weight))


def check_parts(prunings: tuple[Pruning, ...], merges: tuple[Merge, ...], rule: str, at: int, layers: int,
                kv_heads: int, head_dim: int, evicted: torch.Tensor) -> None:
    """Refuse prunings and merges that do not fit a step at slot ``at`` of a model of this shape; ``evicted`` is the
    edit's mask ``(L, KV, at)`` (merge sources included): a merge's target must stay."""
    if rule not in MERGE_RULES:
        raise KvvizError(f"the merge rule must be one of {', '.join(MERGE_RULES)}, got {rule!r}")
    # the merges in one pass each (a session file may hold many): the first that fails a check, in their order
    layer, head, source, target = index_table([(min(m.layer, layers), min(m.head, kv_heads), min(m.source, at),
                                                min(m.target, at)) for m in merges], 4).unbind(1)
    missing = ((layer >= layers) | (head >= kv_heads)).nonzero()
    for part in (*prunings, *(merges[int(i)] for i in missing[:1])):
        if part.layer >= layers or part.head >= kv_heads:
            raise KvvizError(f"layer {part.layer}, KV head {part.head} does not exist ({layers} layers, {kv_heads} "
                             "KV heads)")
    for pruning in prunings:
        if pruning.channels[-1] >= head_dim:
            raise KvvizError(f"channel {pruning.channels[-1]} does not exist (the head dimension is {head_dim})")
        if pruning.slots[-1] >= at:
            raise KvvizError(f"slot {pruning.slots[-1]} is not in the cache before slot {at}")
    outside = (source >= at) | (target >= at)
    lost, inside = torch.zeros_like(outside), ~outside
    if bool(inside.any()):
        lost[inside] = evicted.cpu()[layer[inside], head[inside], target[inside]]
    failing = (outside | lost).nonzero()
    if len(failing):
        merge = merges[int(failing[0])]
        for slot in (merge.source, merge.target):
            if slot >= at:
                raise KvvizError(f"slot {slot} is not in the cache before slot {at}; it cannot be merged")
        raise KvvizError(f"slot {merge.target} is evicted in layer {merge.layer}, KV head {merge.head}; a merge "
                         "needs a kept target")


def index_table(rows: list[tuple[int, ...]], width: int) -> torch.Tensor:
    """``(len(rows), width)`` int64 of rows of non-negative ints below 2**63, through an array (torch.tensor of a list
    of tuples takes ~10x longer: 0.17 s for 262,000 merges' four indices)."""
    return torch.frombuffer(array("q", chain.from_iterable(rows)), dtype=torch.int64).view(-1, width) if rows \
        else torch.zeros(0, width, dtype=torch.int64)


def reshaped(keys: torch.Tensor, values: torch.Tensor, layer: int, prunings: tuple[Pruning, ...],
             merges: tuple[Merge, ...], rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``layer``'s keys and values ``(KV, n, D)`` with its prunings and merges applied (new tensors where changed;
    parts beyond ``n`` are left out). The merges of one round read the values the earlier rounds left: every source's
    contribution is its value before that round, accumulated in float32 (as kvpress' ``MergingPress``)."""
    n = keys.shape[1]
    own_prunings = [p for p in prunings if p.layer == layer and p.slots[0] < n]
    own_merges = [m for m in merges if m.layer == layer and m.target < n and m.source < n]
    if own_prunings:
        keys = keys.clone()
        for pruning in own_prunings:
            slots = torch.tensor([s for s in pruning.slots if s < n], device=keys.device)
            channels = torch.tensor(pruning.channels, device=keys.device)
            keys[pruning.head, slots[:, None], channels[None, :]] = 0
    for round_ in sorted({m.round for m in own_merges}):
        batch = [m for m in own_merges if m.round == round_]
        heads, targets, sources = (torch.tensor([getattr(m, name) for m in batch], device=values.device)
                                   for name in ("head", "target", "source"))
        weights = torch.tensor([m.weight for m in batch], device=values.device, dtype=torch.float32)
        added = torch.zeros(values.shape, dtype=torch.float32, device=values.device)
        added.index_put_((heads, targets), weights[:, None] * values[heads, sources].float(), accumulate=True)
        total = torch.zeros(values.shape[:2], dtype=torch.float32, device=values.device)
        total.index_put_((heads, targets), weights, accumulate=True)
        merged = values.float() + added
        if rule == "average":
            merged = merged / (1 + total)[..., None]
        values = torch.where((total > 0)[..., None], merged.to(values.dtype), values)
    return keys, values


def to_json(prunings: tuple[Pruning, ...], merges: tuple[Merge, ...]) -> dict:
    return {"prune": [{"layer": p.layer, "head": p.head, "channels": list(p.channels), "slots": list(p.slots)}
                      for p in prunings],
            "merge": [[m.layer, m.head, m.source, m.target, m.weight, *([m.round] if m.round else [])] for m in merges]}


def from_json(data) -> tuple[tuple[Pruning, ...], tuple[Merge, ...]]:
    prunings = tuple(Pruning(p["layer"], p["head"], tuple(p["channels"]), tuple(p["slots"]))
                     for p in data.get("prune", []))
    merges = tuple(Merge(*row) for row in data.get("merge", []))
    return prunings, merges


def flags(size: int, chosen: Iterable[int] | None, device: torch.device | None) -> torch.Tensor:
    """Boolean ``(size,)``: all True for ``None``, else True at ``chosen``."""
    if chosen is None:
        return torch.ones(size, dtype=torch.bool, device=device)
    flags = torch.zeros(size, dtype=torch.bool, device=device)
    flags[list(chosen)] = True
    return flags


def optional(value: object) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)  # type: ignore[arg-type]
