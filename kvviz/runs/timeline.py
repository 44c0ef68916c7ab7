"""What a policy run did to its session's cache, step by step: the read side of a session's
:class:`~kvviz.edit.commits.CommitLog`, so that the session's attention weights, what-ifs and time travel see the cache as
it stood at every step.

Commit ``k`` is a compression made when ``at[k]`` slots were cached; it applies to the steps of slots ``≥ at[k]``.
Evictions are final, so one tensor holds them all: ``evicted_at`` ``(L, KV, n)``, the commit that evicted each slot
from each layer and KV head (``NEVER`` if none). The run's cache format (KIVI's window, a written scheme) rounds a
growing prefix of slots, or (QuantizedCache) flushes it all together; the live cache
holds the quantized K/V, the originals are kept to reproduce any step exactly. With re-rotated positions
(kvviz/rope.py) the keys as computed are kept too, with the position each slot held after every commit.

A run that reads a subset per step (``RunSettings.reader``: the cache is kept, each step reads the slots its reader
picks) keeps, per step, the slots that step did not read (:attr:`unread`); they are hidden from that step alone, as
an eviction of that step would hide them.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from functools import partial

import torch
from transformers import Cache

from kvviz import kv_cache
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.rope import Rotary
from kvviz.schemes.cache_format import CacheFormat

NEVER = torch.iinfo(torch.int32).max


class Timeline:
    """The commits of one policy run (see the module doc); a session's ``commits`` that the user cannot push to."""

    stack = ()  # no hand-made commits: a run's cache is edited by its policy only

    def __init__(self, cache: Cache, layers: int, kv_heads: int, cache_format: CacheFormat | None = None,
                 rotary: Rotary | None = None):
        """``cache_format``: how the run stores its cache (kvviz.schemes.cache_format), resolved for the model: KIVI's
        window, a scheme written slot by slot (its first-pass scales fixed here when the first slots are rounded),
        QuantizedCache's flushes; None for the model's own."""
        self.cache, self.layers, self.kv_heads, self.rotary = cache, layers, kv_heads, rotary
        self.format = cache_format
        self.computed: torch.Tensor | None = None  # re-rotated runs: (L, KV, n, D) keys (latent attention: RoPE
        # keys) at the position computed at
        self.processed: list[int] = []  # re-rotated runs: the position each slot was computed at
        self.placed: list[torch.Tensor] = []  # re-rotated runs: per commit, the positions of slots 0..at[k]-1
        self.evicted_at = torch.full((layers, kv_heads, 0), NEVER, dtype=torch.int32)
        self.at: list[int] = []  # slots cached when commit k was made
        self.quantized: list[int] = []  # slots 0..q-1 quantized after commit k
        self.originals: tuple[torch.Tensor, torch.Tensor] | None = None  # (L, KV, q, D): quantized slots as computed
        self._edits: dict[int, Edit] = {}
        self.parts: list[tuple[int, Edit]] = []  # (commit, its prunings and merges), kvviz.edit.reshape
        self.flushes: list[tuple[int, int]] = []  # (commit, slots 0..upto-1 quantized again then)
        self.unshaped: tuple[torch.Tensor, torch.Tensor] | None = None  # (L, KV, m, D): slots 0..m-1 as computed
        self.own_from: int | None = None  # written ``own`` runs: the first slot whose pass attended to its K/V rounded
        self._fresh: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(layers)]  # … and as computed
        self.unread: dict[int, torch.Tensor] = {}  # slot → (L, KV, slot): what that step did not read (a reader's)

    # --- the read side of Commits (kvviz.edit.commits) ------------------------------------------------------

    def index(self, slot: int) -> int:
        """The commit in force when slot ``slot`` is processed (-1: none)."""
        return bisect.bisect_right(self.at, slot) - 1

    def edit_at(self, slot: int) -> Edit:
        """The cumulative edit in force when slot ``slot`` was (or will be) processed (with a reader, the slots that
        step did not read evicted too)."""
        edit = self._commit_edit(slot)
        if slot not in self.unread:
            return edit
        mask = self.unread[slot] | edit.evicted_mask(slot, self.layers, self.kv_heads).cpu()
        return replace(edit, evictions=Edit.from_evicted(mask).evictions)

    def _commit_edit(self, slot: int) -> Edit:
        """The cumulative edit of the commits in force when slot ``slot`` is processed (cached per commit)."""
        k = self.index(slot)
        if k < 0:
            return Edit()
        if k not in self._edits:
            if len(self._edits) >= 8:
                self._edits.pop(next(iter(self._edits)))
            evictions = Edit.from_evicted(self.evicted_at[:, :, : self.at[k]] <= k).evictions
            quantized = self.format.edit(range(self.quantized[k])) if self.format and self.quantized[k] else Edit()
            parts = [part for j, part in self.parts if j <= k]
            self._edits[k] = Edit(evictions=evictions, key_bits=quantized.key_bits, value_bits=quantized.value_bits,
                                  keys=quantized.keys, values=quantized.values, exact_layers=quantized.exact_layers,
                                  prunings=tuple(p for part in parts for p in part.prunings),
                                  merges=tuple(m for part in parts for m in part.merges),
                                  merge_rule=parts[0].merge_rule if parts else "average")
        return self._edits[k]

    @property
    def current(self) -> Edit:
        return self.edit_at(self.at[-1]) if self.at else Edit()

    def step_edits(self, at: int, edit: Edit) -> tuple[Edit, Edit]:
        """For the step of slot ``at``: the run's edit then, and ``edit`` on top of it."""
        full = self.edit_at(at).resolved(at)
        return full, full.merged(edit.resolved(at))

    def boundaries(self) -> list[int]:
        """The slots from which what a step sees changes: each commit's, and each step that read a subset (its own
        rows: it and the step after)."""
        return sorted({*self.at, *self.unread, *(slot + 1 for slot in self.unread)})

    def hidden(self, slot: int, length: int) -> torch.Tensor:
        """Bool ``(L, KV, length)``: the slots hidden from the step of slot ``slot``."""
        mask = torch.zeros(self.layers, self.kv_heads, length, dtype=torch.bool)
        known = min(length, self.evicted_at.shape[-1])
        mask[:, :, :known] = self.evicted_at[:, :, :known] <= self.index(slot)
        if slot in self.unread:
            known = min(length, slot)
            mask[:, :, :known] |= self.unread[slot][:, :, :known]
        return mask

    def read(self, at: int, unread: torch.Tensor) -> None:
        """The step of slot ``at`` reads all but ``unread`` (bool ``(L, KV, at)``) of the slots it sees; the cache keeps
        them (a reader's choice, for this step alone)."""
        self.unread[at] = unread.cpu().clone()

    def key_version(self, slot: int) -> int:
        """Equal for slots whose steps saw the same keys: how many slots were quantized then (re-rotated: the commit,
        as every one moves keys; written ``own`` runs after their first pass: every slot, as the live cache holds
        them)."""
        k = self.index(slot)
        if self.rotary is not None:
            return k
        if self.own_from is not None and slot >= self.own_from:  # every slot up to its own, rounded
            return NEVER
        if self.flushes:
            return sum(j <= k for j, _ in self.flushes)
        if self.parts:  # pruned keys (no cache format then): the prunings in force
            return sum(j <= k and bool(part.prunings) for j, part in self.parts)
        return self.quantized[k] if k >= 0 else 0

    def step_kv(self, layer: int, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, at, D)`` of the slots before ``at`` as the step of slot ``at`` saw them, before
        quantization: re-rotated to the positions they held then."""
        if self.flushes:  # QuantizedCache: its states cannot be rebuilt by an Edit; the step's own K/V
            return self.flushed_kv(layer, self.index(at), at)
        pair = list(self.original_kv(layer, at))
        if self.rotary is not None:
            pair[self.rotary.part] = self._placed(layer, at, at)
        return tuple(pair)

    def writes(self, slot: int) -> list | None:
        """Per layer, how the pass of slot ``slot`` stores (and attends to) its own new K/V (kvviz.kv_cache.Writer),
        or None when as computed: written ``own`` runs after their first pass."""
        if self.own_from is None or slot < self.own_from:
            return None
        return [partial(self.format.rounded, layer) for layer in range(self.layers)]

    def _placed(self, layer: int, slot: int, stop: int) -> torch.Tensor:
        """Re-rotated runs: keys ``(KV, stop, D)`` (latent attention: RoPE keys, the values) at the positions in force
        for the step of ``slot``."""
        k = self.index(slot)
        delta = torch.zeros(stop, dtype=torch.long)
        if k >= 0:
            placed = self.placed[k][:stop]
            delta[: len(placed)] = placed - torch.tensor(self.processed[: len(placed)])
        return self.rotary.rotate(self.computed[layer, :, :stop], delta, layer)

    def keys_at(self, layer: int, slot: int, stop: int) -> torch.Tensor:
        """Keys ``(KV, stop, D)`` of ``layer`` as the step of slot ``slot`` saw them."""
        return self._seen(0, layer, slot, stop)

    def values_at(self, layer: int, slot: int, stop: int) -> torch.Tensor:
        """Values ``(KV, stop, D)`` of ``layer`` as the step of slot ``slot`` saw them — what a latent cache's queries
        score its RoPE keys by. Not for runs that merged values (a latent cache refuses merges)."""
        return self._seen(1, layer, slot, stop)

    def _seen(self, part: int, layer: int, slot: int, stop: int) -> torch.Tensor:
        """The keys (``part`` 0) or values (1) ``(KV, stop, D)`` of ``layer`` as the step of slot ``slot`` saw them:
        placed where a re-rotated run had them, as QuantizedCache's flushes left them, pruned, or rounded by the run's
        cache format."""
        def original() -> torch.Tensor:  # read only where it is needed
            return self.original_kv(layer, stop)[part]

        rounded = Edit.quantized_keys if part == 0 else Edit.quantized_values
        if self.rotary is not None:
            return self._placed(layer, slot, stop) if self.rotary.part == part else original()
        if self.flushes:
            return self.flushed_kv(layer, self.index(slot), stop)[part]
        if self.parts and part == 1:
            raise NotImplementedError("values as a step saw them, after merges: read for latent caches, which refuse "
                                      "merges")
        if self.parts:
            return rounded(self.edit_at(slot), original(), layer)
        quantized = min(self.key_version(slot), stop)
        if not quantized:
            return original()
        if self.format.grouping == "shared":  # the scales depended on every slot quantized then
            return rounded(self.format.edit(range(quantized)), original(), layer)
        live = kv_cache.layer_kv(self.cache, layer)[part][0, :, :stop]  # blocks: quantized once, never again
        return torch.cat([live[:, :quantized], original()[:, quantized:]], dim=1)

    def evicted(self, length: int) -> torch.Tensor | None:
        """Bool ``(L, KV, length)`` of the slots hidden from the next step, or None when none is."""
        mask = self.hidden(length - 1, length) if self.at or self.unread else None
        return mask.to(kv_cache.layer_kv(self.cache, 0)[0].device) if mask is not None and bool(mask.any()) else None

    def original_kv(self, layer: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, stop, D)`` of ``layer`` as the model computed them (before quantization)."""
        keys, values = (t[0, :, :stop] for t in kv_cache.layer_kv(self.cache, layer))
        if self.unshaped is not None:  # pruned or merged slots: as computed (runs that reshape quantize nothing)
            m = min(self.unshaped[0].shape[2], stop)
            return tuple(torch.cat([kept[layer, :, :m], live[:, m:]], dim=1) for kept, live in zip(self.unshaped,
                                                                                                   (keys, values)))
        self._settle()
        q = min(0 if self.originals is None else self.originals[0].shape[2], stop)
        if not q:
            return keys, values
        return tuple(torch.cat([original[layer, :, :q], live[:, q:]], dim=1)
                     for original, live in zip(self.originals, (keys, values)))

    def push(self, edit: Edit, at: int) -> None:
        raise KvvizError("a policy run's cache is edited by its policy; try edits of a step in its what-if instead")

    def pop(self) -> None:
        raise KvvizError("a policy run has no hand-made commit to undo")

    # --- what the run writes ---------------------------------------------------------------------------------

    def record(self, at: int, evict: torch.Tensor | None, quantize: int = 0) -> bool:
        """Compress before the step of slot ``at``: evict ``evict`` (bool ``(L, KV, at)``, alive slots) and quantize
        the slots ``0..quantize-1`` (the cache format's schedule). Returns whether anything changed."""
        old_q = self.quantized[-1] if self.quantized else 0
        new = evict is not None and bool(evict.any())
        if not new and quantize <= old_q:
            return False
        if self.at and self.at[-1] == at:  # a second compression before the same step joins the first
            k = len(self.at) - 1
            self._edits.pop(k, None)
        else:
            k = len(self.at)
            self.at.append(at)
            self.quantized.append(old_q)
        if self.evicted_at.shape[-1] < at:
            self.evicted_at = torch.nn.functional.pad(self.evicted_at, (0, at - self.evicted_at.shape[-1]), value=NEVER)
        if new:
            self.evicted_at[:, :, :at][evict.cpu() & (self.evicted_at[:, :, :at] == NEVER)] = k
        if quantize > old_q:
            self._quantize(old_q, quantize)
            self.quantized[k] = quantize
        if self.rotary is not None:
            self._rerotate(k, at)
        return True

    def reshape(self, at: int, edit: Edit) -> bool:
        """Prune and merge as ``edit`` says before the step of slot ``at`` (joining a compression made then), writing
        the result into the live cache and keeping slots ``0..at-1`` as computed. Returns whether anything changed."""
        if not edit.reshapes:
            return False
        k = self._commit_at(at)
        live = self._keep_computed(at)
        for layer, (keys, values) in enumerate(live):
            new_keys, new_values = edit.quantized(keys[0, :, :at], values[0, :, :at], layer)
            keys[0, :, :at], values[0, :, :at] = new_keys, new_values
        self.parts.append((k, edit))
        self._edits.pop(k, None)
        return True

    def flush(self, at: int, upto: int) -> None:
        """QuantizedCache's flush before the step of slot ``at``: slots ``0..upto-1`` quantized together from what the
        live cache holds (the earlier flushes' values rounded again), keeping them as computed first."""
        self._commit_at(at)
        live = self._keep_computed(upto)
        for keys, values in live:
            keys[0, :, :upto], values[0, :, :upto] = self.format.flushed(keys[0, :, :upto], values[0, :, :upto])
        self.flushes.append((len(self.at) - 1, upto))

    def flushed_kv(self, layer: int, k: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(KV, stop, D)`` of ``layer`` as QuantizedCache held them under commit ``k``: the flushes
        up to it replayed in order on the K/V as computed, each on the whole flush (HQQ's axis-0 groups span slots)."""
        reach = max([stop] + [upto for j, upto in self.flushes if j <= k])
        keys, values = (t.clone() for t in self.original_kv(layer, reach))
        for j, upto in self.flushes:
            if j <= k:
                keys[:, :upto], values[:, :upto] = self.format.flushed(keys[:, :upto], values[:, :upto])
        return keys[:, :stop], values[:, :stop]

    def _keep_computed(self, upto: int) -> list:
        """Keep slots ``0..upto-1`` as computed (those not kept yet are still so in the live cache) before they are
        rewritten; returns every layer's live ``(keys, values)``."""
        live = [kv_cache.layer_kv(self.cache, layer) for layer in range(self.layers)]
        held = 0 if self.unshaped is None else self.unshaped[0].shape[2]
        if upto > held:
            added = tuple(torch.stack([kv[i][0, :, held:upto] for kv in live]) for i in (0, 1))
            self.unshaped = added if self.unshaped is None else tuple(
                torch.cat([o, a], dim=2) for o, a in zip(self.unshaped, added))
        return live

    def _commit_at(self, at: int) -> int:
        """The commit made before the step of slot ``at`` (a new one unless one was made then)."""
        if not (self.at and self.at[-1] == at):
            self.at.append(at)
            self.quantized.append(self.quantized[-1] if self.quantized else 0)
            if self.evicted_at.shape[-1] < at:
                self.evicted_at = torch.nn.functional.pad(self.evicted_at, (0, at - self.evicted_at.shape[-1]),
                                                          value=NEVER)
        return len(self.at) - 1

    def note_computed(self, positions: list[int]) -> None:
        """Re-rotated runs, after a forward pass: keep the new slots' keys as computed, at ``positions``."""
        start, stop = len(self.processed), len(self.processed) + len(positions)
        part = self.rotary.part
        added = torch.stack([kv_cache.layer_kv(self.cache, layer)[part][0, :, start:stop]
                             for layer in range(self.layers)])
        self.computed = added.clone() if self.computed is None else torch.cat([self.computed, added], dim=2)
        self.processed.extend(positions)

    def _rerotate(self, k: int, at: int) -> None:
        """Move the kept slots before ``at`` to the positions of their order (0, 1, …) in the live cache."""
        alive = ~(self.evicted_at[:, :, :at] <= k)  # (L, KV, at)
        if not bool((alive == alive[:1, :1]).all()):
            raise KvvizError("re-rotated positions need the same slots kept in every layer and KV head; this policy "
                             "keeps different ones: use original positions")
        kept = alive[0, 0]
        placed = torch.where(kept, kept.long().cumsum(0) - 1, torch.tensor(self.processed[:at]))
        self.placed[k:] = [placed]
        delta = placed - torch.tensor(self.processed[:at])
        for layer in range(self.layers):
            rotated = kv_cache.layer_kv(self.cache, layer)[self.rotary.part]
            rotated[0, :, :at] = self.rotary.rotate(self.computed[layer, :, :at], delta, layer)

    def kept_count(self, at: int) -> int:
        """Slots before ``at`` the next step sees (the same in every layer and KV head in re-rotated runs)."""
        return int((~self.hidden(at, at))[0, 0].sum())

    def _quantize(self, old: int, new: int) -> None:
        """Keep the originals of slots ``old..new-1`` and write the quantized K/V of the prefix into the live cache
        (written ``own`` runs: the slots their passes rounded as written are kept already)."""
        self._settle()
        if self.originals is not None and self.originals[0].shape[2] >= new:
            return
        live = [kv_cache.layer_kv(self.cache, layer) for layer in range(self.layers)]
        added = tuple(torch.stack([kv[i][0, :, old:new] for kv in live]) for i in (0, 1))  # (L, KV, new-old, D)
        self.originals = added if self.originals is None else tuple(
            torch.cat([o, a], dim=2) for o, a in zip(self.originals, added))
        if not old:  # scales that span slots are fixed by the first pass
            self.format = self.format.after_first_pass(*added)
        first = old if self.format.grouping == "blocks" else 0  # shared scales: the whole prefix again
        edit = self.format.edit(range(first, new))
        for layer, (keys, values) in enumerate(live):
            edit.quantize_(keys[0, :, :new], values[0, :, :new],
                           source=(self.originals[0][layer], self.originals[1][layer]), layer=layer)
        if self.format.own and self.own_from is None:
            self.own_from = new  # from now on the cache rounds what it is written, keeping it as computed here
            for layer, entry in enumerate(kv_cache.entries(self.cache)):
                entry.written = partial(self._write, layer)

    def _write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The live cache's writer of ``layer`` in written ``own`` runs: new keys and values ``(1, KV, q, D)`` kept as
        computed, returned rounded."""
        if layer == 0:  # a new pass
            self._settle()
        self._fresh[layer].append((keys[0].detach().clone(), values[0].detach().clone()))
        return self.format.rounded(layer, keys, values)

    def _settle(self) -> None:
        """Between passes: the K/V as computed that the live cache's writers kept move to :attr:`originals` (a pass
        that failed midway left some layers only: dropped), which keep the slots the live cache holds (a pass cut
        back, as a blame's variants are, leaves none)."""
        if self.own_from is None:  # only the writers of own runs keep K/V here
            return
        if self._fresh[-1]:
            added = tuple(torch.stack([torch.cat([pair[i] for pair in chunks], dim=1) for chunks in self._fresh])
                          for i in (0, 1))  # (L, KV, q, D)
            self.originals = tuple(torch.cat([o, a], dim=2) for o, a in zip(self.originals, added))
        if any(self._fresh):
            self._fresh = [[] for _ in range(self.layers)]
        if self.originals is not None:
            length = self.cache.get_seq_length()
            if self.originals[0].shape[2] > length:
                self.originals = tuple(t[:, :, :length] for t in self.originals)
