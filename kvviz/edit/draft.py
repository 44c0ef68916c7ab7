"""An edit being composed by clicks: the mutable companion of the immutable :class:`~kvviz.edit.edit.Edit`.

The dashboard keeps one per browser session. A policy can seed it; clicks toggle evictions and selections; a
bit-width picker applies to the selection. :meth:`EditDraft.edit` returns the validated Edit to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvviz.edit.edit import Edit, Eviction, Merge, Pruning
from kvviz.quant.quantizer import Quantizer, check_bits


@dataclass
class EditDraft:
    evicted: set[int] = field(default_factory=set)  # evicted everywhere, by hand
    key_bits: dict[int, int] = field(default_factory=dict)
    value_bits: dict[int, int] = field(default_factory=dict)
    selected: set[int] = field(default_factory=set)
    policy: Edit = field(default_factory=Edit)  # a policy's (possibly per-head) evictions, the starting point
    policy_name: str = ""
    policy_settings: dict[str, int | float] = field(default_factory=dict)  # the seeding policy's parameters
    keys: Quantizer = field(default_factory=lambda: Quantizer("channel"))
    values: Quantizer = field(default_factory=lambda: Quantizer("token"))
    decided_by: tuple | None = None  # (policy, budget, at) that seeded the mask: why each slot went (not saved)
    prunings: tuple[Pruning, ...] = ()  # key channels pruned (ThinK)
    merges: tuple[Merge, ...] = ()  # evicted values merged into kept slots
    merge_rule: str = "average"
    head_widths: tuple[tuple[int, ...], ...] | None = None  # mixed precision per (layer, KV head), from a scheme

    def toggle_evicted(self, slot: int) -> None:
        """Evict ``slot`` everywhere, or bring it back (also from the policy's evictions)."""
        policy_slots = {s for e in self.policy.evictions for s in e.slots}
        if slot in self.evicted or slot in policy_slots:
            self.evicted.discard(slot)
            self.policy = Edit(evictions=tuple(
                Eviction(tuple(s for s in e.slots if s != slot), e.layers, e.heads) for e in self.policy.evictions))
        else:
            self.evicted.add(slot)

    def toggle_selected(self, slot: int) -> None:
        self.selected ^= {slot}

    def set_bits(self, slots: set[int] | list[int], key_bits: int, value_bits: int) -> None:
        """Store ``slots`` at the given bit-widths (16 = untouched)."""
        check_bits(key_bits), check_bits(value_bits)
        for slot in slots:
            for table, bits in ((self.key_bits, key_bits), (self.value_bits, value_bits)):
                if bits == 16:
                    table.pop(slot, None)
                else:
                    table[slot] = bits

    def rewidth(self, bits: int) -> int:
        """Every quantized key and value of the draft at ``bits`` instead (a number format with one width of its own:
        FP8 8, FP4 4); returns how many slots changed."""
        check_bits(bits)
        changed = {s for table in (self.key_bits, self.value_bits) for s, b in table.items() if b != bits}
        for table in (self.key_bits, self.value_bits):
            table.update(dict.fromkeys(table, bits))
        return len(changed)

    def evict_many(self, slots: list[int]) -> None:
        self.evicted.update(slots)

    def seed(self, policy_edit: Edit, name: str, settings: dict[str, int | float] | None = None,
             decided_by: tuple | None = None) -> None:
        """Start from a policy's mask (hand evictions are cleared; bit-widths stay); ``decided_by``: the
        ``(policy, budget, at)`` that made it, so the strip can say why each slot went."""
        self.policy, self.policy_name, self.evicted = policy_edit, name, set()
        self.policy_settings = dict(settings or {})
        self.decided_by = decided_by

    def clear(self) -> None:
        self.evicted, self.key_bits, self.value_bits, self.selected = set(), {}, {}, set()
        self.policy, self.policy_name, self.policy_settings = Edit(), "", {}
        self.prunings, self.merges, self.merge_rule, self.decided_by = (), (), "average", None

    def reshape(self, prunings: tuple[Pruning, ...] | None = None, merges: tuple[Merge, ...] | None = None,
                rule: str | None = None) -> None:
        """Replace the draft's prunings and / or merges (and the merge rule)."""
        self.prunings = self.prunings if prunings is None else tuple(prunings)
        self.merges = self.merges if merges is None else tuple(merges)
        self.merge_rule = self.merge_rule if rule is None else rule

    def evicted_somewhere(self) -> set[int]:
        """Slots evicted in at least one layer / head (merged ones too)."""
        return set(self.evicted) | {s for e in self.policy.evictions for s in e.slots} | {m.source for m in self.merges}

    @classmethod
    def from_edit(cls, edit: Edit, policy_name: str = "", policy_settings: dict | None = None) -> EditDraft:
        """The draft whose :meth:`edit` is ``edit``: evictions everywhere become hand evictions, scoped ones the
        policy's mask (named ``policy_name``); bit-widths and quantizers as they are."""
        draft = cls(key_bits=dict(edit.key_bits), value_bits=dict(edit.value_bits), keys=edit.keys, values=edit.values,
                    prunings=edit.prunings, merges=edit.merges, merge_rule=edit.merge_rule, head_widths=edit.head_widths)
        draft.seed(Edit(evictions=tuple(e for e in edit.evictions if not e.everywhere)), policy_name, policy_settings)
        draft.evicted = {s for e in edit.evictions if e.everywhere for s in e.slots}
        return draft

    def edit(self, before: int | None = None) -> Edit:
        """The Edit for a step at slot ``before`` (slots from ``before`` on are left out: they are not cached yet)."""
        keep = (lambda s: s < before) if before is not None else (lambda s: True)  # noqa: E731
        evictions = tuple(Eviction(tuple(filter(keep, e.slots)), e.layers, e.heads) for e in self.policy.evictions)
        if self.evicted:
            evictions += (Eviction(tuple(filter(keep, self.evicted))),)
        prunings = tuple(Pruning(p.layer, p.head, p.channels, tuple(filter(keep, p.slots))) for p in self.prunings
                         if keep(p.slots[0]))
        return Edit(evictions=tuple(e for e in evictions if e.slots),
                    key_bits={s: b for s, b in self.key_bits.items() if keep(s)},
                    value_bits={s: b for s, b in self.value_bits.items() if keep(s)},
                    keys=self.keys, values=self.values, prunings=prunings,
                    merges=tuple(m for m in self.merges if keep(m.source) and keep(m.target)),
                    merge_rule=self.merge_rule, head_widths=self.head_widths)
