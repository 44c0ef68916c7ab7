"""Edits committed to a session's cache: later steps run on the edited cache; positions stay absolute.

Representation, chosen so that every past step stays exactly reproducible:
- evicted slots stay in the cache and are hidden per (layer, KV head) by the session's probe — this equals removing
  them (tested: removal and masking give the same logits), and it keeps slot index == cache index;
- quantized, pruned and merged-into slots hold their edited K/V in the live cache; their original K/V are kept here,
  so an undo restores them and the step of any earlier slot can be replayed on the cache exactly as it stood then.
Each commit stores the cumulative edit and the number of slots cached when it was made; slot ``t`` was processed under
the newest commit made when at most ``t`` slots were cached.

:class:`Commits` is what every commit log answers: :class:`CommitLog` (a session's) and ``kvviz.runs.timeline.Timeline``
(a policy run's, whose commits its policy makes) both satisfy it, checked by mypy in the test suite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import Cache, DynamicCache

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError


@dataclass(frozen=True)
class Commit:
    at: int  # slots cached when the edit was committed; it applies to the steps of slots >= at
    edit: Edit  # cumulative and resolved (no full-precision window left)


class Commits(Protocol):
    """A session's commit log as the session, its attention weights, the what-if and time travel read it: which edit
    each step ran under, which slots it hid, the keys and values it saw; ``push`` / ``pop`` commit and undo (a log
    whose commits are not the user's refuses them with a :class:`KvvizError`)."""

    layers: int
    kv_heads: int

    @property
    def cache(self) -> Cache:
        """The session's cache, whose slots the log's edits hide or hold quantized."""
        ...

    @property
    def stack(self) -> Sequence[Commit]:
        """The user's commits, oldest first (empty where the user makes none)."""
        ...

    @property
    def current(self) -> Edit:
        """The edit in force for the next step."""
        ...

    def edit_at(self, slot: int) -> Edit:
        """The cumulative edit in force when slot ``slot`` was (or will be) processed."""
        ...

    def step_edits(self, at: int, edit: Edit) -> tuple[Edit, Edit]:
        """For the step of slot ``at``: the edit in force then and ``edit`` on top of it."""
        ...

    def hidden(self, slot: int, length: int) -> torch.Tensor:
        """Bool ``(L, KV, length)``: the slots hidden from the step of slot ``slot``."""
        ...

    def step_kv(self, layer: int, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, at, D)`` of the slots before ``at`` as computed, before quantization."""
        ...

    def keys_at(self, layer: int, slot: int, stop: int) -> torch.Tensor:
        """Keys ``(KV, stop, D)`` of ``layer`` as the step of slot ``slot`` saw them."""
        ...

    def values_at(self, layer: int, slot: int, stop: int) -> torch.Tensor:
        """Values ``(KV, stop, D)`` of ``layer`` as the step of slot ``slot`` saw them (read for latent caches, whose
        queries score the RoPE key held as values)."""
        ...

    def writes(self, slot: int) -> list | None:
        """Per layer, how the pass of slot ``slot`` stored its own new K/V (kvviz.kv_cache.Writer); None: as
        computed."""
        ...

    def key_version(self, slot: int) -> int:
        """Equal for slots whose steps saw the same keys."""
        ...

    def boundaries(self) -> list[int]:
        """The slots at which the edit in force changes."""
        ...

    def evicted(self, length: int) -> torch.Tensor | None:
        """Bool ``(L, KV, length)`` of the slots the current edit hides, or None when it hides nothing."""
        ...

    def original_kv(self, layer: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, stop, D)`` of ``layer`` as the model computed them."""
        ...

    def push(self, edit: Edit, at: int) -> None:
        """Commit ``edit`` (validated for a step at ``at``) on top of the current one."""
        ...

    def pop(self) -> None:
        """Undo the newest commit."""
        ...


class CommitLog:
    """The commit stack of one session, and the original K/V of the slots it quantized."""

    def __init__(self, cache: DynamicCache, layers: int, kv_heads: int):
        self.cache, self.layers, self.kv_heads = cache, layers, kv_heads
        self.stack: list[Commit] = []
        self._originals: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # slot -> keys, values (L, KV, D)

    @property
    def current(self) -> Edit:
        return self.stack[-1].edit if self.stack else Edit()

    def edit_at(self, slot: int) -> Edit:
        """The edit in force when slot ``slot`` was (or will be) processed."""
        for commit in reversed(self.stack):
            if commit.at <= slot:
                return commit.edit
        return Edit()

    def step_edits(self, at: int, edit: Edit) -> tuple[Edit, Edit]:
        """For the step of slot ``at``: the edit in force then (the "full" cache) and ``edit`` on top of it."""
        full = self.edit_at(at).resolved(at)
        return full, full.merged(edit.resolved(at))

    def hidden(self, slot: int, length: int) -> torch.Tensor:
        """Bool ``(L, KV, length)``: the slots hidden from the step of slot ``slot``."""
        return self.edit_at(slot).evicted_mask(length, self.layers, self.kv_heads,
                                               kv_cache.layer_kv(self.cache, 0)[0].device)

    def step_kv(self, layer: int, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, at, D)`` of the slots before ``at`` as the model computed them, before quantization
        (positions never change here)."""
        return self.original_kv(layer, at)

    def keys_at(self, layer: int, slot: int, stop: int) -> torch.Tensor:
        """Keys ``(KV, stop, D)`` of ``layer`` as the step of slot ``slot`` saw them (quantized as committed then)."""
        return self.edit_at(slot).quantized_keys(self.original_kv(layer, stop)[0], layer)

    def values_at(self, layer: int, slot: int, stop: int) -> torch.Tensor:
        """Values ``(KV, stop, D)`` of ``layer`` as the step of slot ``slot`` saw them (quantized as committed then;
        merges are not applied: read for latent caches, which refuse them)."""
        return self.edit_at(slot).quantized_values(self.original_kv(layer, stop)[1], layer)

    def writes(self, slot: int) -> None:
        """A pass stores its new K/V as computed (commits edit the slots before a step, not the step's own)."""
        return None

    def key_version(self, slot: int) -> int:
        """Equal for slots whose steps saw the same keys (the commit in force)."""
        return sum(commit.at <= slot for commit in self.stack)

    def boundaries(self) -> list[int]:
        return [commit.at for commit in self.stack]

    def evicted(self, length: int) -> torch.Tensor | None:
        """Boolean ``(L, KV, length)`` of the slots the current edit hides, or None when it hides nothing."""
        edit = self.current
        if not edit.evicted_slots():  # evictions and merge sources
            return None
        device = kv_cache.layer_kv(self.cache, 0)[0].device
        return edit.evicted_mask(length, self.layers, self.kv_heads, device)

    def original_kv(self, layer: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, stop, D)`` of ``layer`` as the model computed them (before any quantization)."""
        keys, values = (t[0, :, :stop] for t in kv_cache.layer_kv(self.cache, layer))
        restore = [slot for slot in self._originals if slot < stop]
        if not restore:
            return keys, values
        keys, values = keys.clone(), values.clone()
        for slot in restore:
            keys[:, slot], values[:, slot] = self._originals[slot][0][layer], self._originals[slot][1][layer]
        return keys, values

    def push(self, edit: Edit, at: int) -> None:
        """Commit ``edit`` (already validated for a step at ``at``) on top of the current one."""
        self.stack.append(Commit(at, self.current.merged(edit.resolved(at))))
        self._materialize()

    def pop(self) -> None:
        if not self.stack:
            raise KvvizError("there is no committed edit to undo")
        self.stack.pop()
        self._materialize()

    def _materialize(self) -> None:
        """Rewrite the live cache: originals back everywhere, then the current edit's quantization."""
        edit = self.current.resolved(self.stack[-1].at) if self.stack else Edit()
        quantized = edit.rewritten_slots()  # the live cache holds them changed: their originals are kept here
        for slot in set(self._originals) | quantized:
            if slot not in self._originals:
                self._originals[slot] = (
                    torch.stack([kv_cache.layer_kv(self.cache, l)[0][0, :, slot] for l in range(self.layers)]),
                    torch.stack([kv_cache.layer_kv(self.cache, l)[1][0, :, slot] for l in range(self.layers)]),
                )
        stop = max(quantized, default=-1) + 1
        for layer in range(self.layers):
            keys, values = kv_cache.layer_kv(self.cache, layer)
            original_keys, original_values = self.original_kv(layer, keys.shape[2])
            new_keys, new_values = edit.quantized(original_keys[:, :stop], original_values[:, :stop], layer)
            keys[0].copy_(original_keys)
            values[0].copy_(original_values)
            keys[0, :, :stop], values[0, :, :stop] = new_keys, new_values
        self._originals = {slot: self._originals[slot] for slot in quantized}
