"""The unedited run of one what-if step ("full"), kept per session until its cache changes, and the caches the edited
runs of that step get: the full run's own (lent to edits that change no K/V) or a quantized copy kept between runs.
Keys and values are held as ``(L, KV, n, D)`` tensors, so what the what-if computes around the runs is done for all
layers at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import Cache

from kvviz import attention_math as am
from kvviz import kv_cache, recurrent
from kvviz.attention_support import AttentionRule
from kvviz.edit.parts import reshaped
from kvviz.edit.edit import Edit
from kvviz.kv_cache import KV
from kvviz.recorder import Probe, probing
from kvviz.session import Session
from kvviz.step_variants import states_before
from kvviz.whatif.continuation import greedy
from kvviz.whatif.metrics import Reference


class FullStepProbe(Probe):
    """The unedited run: hides what the session's own committed edit hid, and keeps what the edited run compares to:
    the queries and the attention outputs per layer while the run is on; :meth:`finish` adds α and o."""

    def __init__(self, hidden: torch.Tensor | None, rule: AttentionRule):
        self.hidden, self.rule = hidden, rule
        self.queries, self.outputs = [], []
        self.read, self.index_scores = [], []  # sparse selection (kvviz.sparse): (n,) each, per layer

    def on_query(self, layer, query, key, value):
        self.queries.append(query[0])  # (H, 1, D)
        return None if self.hidden is None else ~self.hidden[layer][None]

    def on_output(self, layer, output):
        self.outputs.append(output[0, 0].float())  # (H, D)

    def on_read(self, layer, read, scores):
        self.read.append(read[0, -1])
        self.index_scores.append(scores[0, -1])

    def finish(self, buffers: KV) -> None:
        """After the run, on its cache ``buffers`` (keys, values ``(L, KV, n, D)``), for all layers at once: the queries
        ``(L, H, 1, D)``, the step's score with its own key ``(L, H, 1, 1)``, α ``(L, H, n)`` float64, o = Σ α v (for
        the closed form of docs/math.md §3; with latent attention the average latent, :meth:`AttentionRule.carried`)
        and the attention outputs ``(L, H, D)``. With sparse selection, α is over the slots the step read, and the
        read sets and the indexer's scores are kept as ``(L, 1, n)`` (:attr:`read`, :attr:`index_scores`; None
        without)."""
        self.queries, self.outputs = torch.stack(self.queries), torch.stack(self.outputs)
        scores = self.rule.scores(self.queries, self.rule.keyed(*buffers))  # (L, H, 1, n)
        self.own_scores = scores[..., -1:].clone()
        hidden = self.hidden
        if self.read:
            self.read, self.index_scores = torch.stack(self.read)[:, None], torch.stack(self.index_scores)[:, None]
            hidden = ~self.read if hidden is None else hidden | ~self.read
        else:
            self.read = self.index_scores = None
        self.alpha = self.rule.softmax(scores, None, hidden, torch.float64)[..., 0, :]
        self.attended = am.output(self.alpha, self.rule.carried(*buffers))


@dataclass
class FullStep:
    """The unedited run of one step, kept by the session until its cache changes: clicking through edits at the
    same step re-runs only the edited pass, on a cache kept here too (:meth:`lent`)."""

    at: int
    position: int
    probe: FullStepProbe
    logits: torch.Tensor
    hidden_states: tuple
    hidden: torch.Tensor | None
    segments: list[str]  # of slots 0..at-1
    committed: Edit  # the edit in force at this step, which the full run's cache holds
    buffers: KV  # (L, KV, at + 1, D) each: the keys and values of the full run's cache, its own slot included
    continuations: dict = field(default_factory=dict)
    originals: KV | None = None  # (L, KV, at, D) each: slots 0..at-1 as the model computed them
    scratch: KV | None = None  # (L, KV, at + 1, D) each: the cache of edited runs that quantize otherwise
    written: tuple = ()  # the quantization (see :meth:`plan`) last written into the scratch buffers
    finished: bool = False  # whether that writing finished: the buffers then hold all of it
    edited: KV | None = None  # the buffers the last edited run read: ``buffers`` (lent) or ``scratch``
    views: dict = field(default_factory=dict)  # per-layer views of ``buffers`` / ``scratch``, made once
    writes: list | None = None  # per layer, how the step stores its own K/V (Commits.writes; None: as computed)
    states: dict = field(default_factory=dict)  # a hybrid's recurrent layers before this step (kvviz.recurrent)
    after: dict = field(default_factory=dict)  # … and after the full run of it (its continuation starts there)
    indexed: list | None = None  # sparse selection: per layer the indexer keys of slots 0..at-1 (kv_cache.indexer_keys)
    indexed_after: list | None = None  # … and of slots 0..at after the full run
    _reference: Reference | None = None

    @property
    def reference(self) -> Reference:
        """The full run's next-token distribution as edited runs are compared to it (made once)."""
        if self._reference is None:
            self._reference = Reference(self.logits)
        return self._reference

    def _over(self, name: str) -> Cache:
        """A cache over the first ``at`` slots of the buffers named ``name`` (``buffers`` or ``scratch``); their
        per-layer views are made once (fewer operations per click)."""
        if name not in self.views:
            layers = layer_views(getattr(self, name))
            self.views[name] = layers, kv_cache.leading(layers, self.at)
        layers, cached = self.views[name]
        return kv_cache.over(layers, self.at, cached, self.writes, recurrent.layers(self.states), self.indexed)

    def plan(self, edit: Edit) -> tuple:
        """What ``edit`` writes into the cache: per kind, its quantizer with its widths per head and its ``(bit-width,
        slots)`` groups; then its prunings and merges (None when it has none)."""
        reshape = (edit.prunings, edit.merges, edit.merge_rule) if edit.reshapes else None
        return (*(((edit.keys if kind == "key" else edit.values, edit.head_widths, edit.exact_layers),
                   edit.groups(kind, self.at))
                  for kind in ("key", "value")), reshape)

    @contextmanager
    def lent(self, session: Session, edit: Edit) -> Iterator[Cache]:
        """The cache for an edited run, for the duration of the block: slots ``0..at-1`` with ``edit``'s quantization,
        and room for this step's own K/V. Whatever the block does (also when it fails), a borrowed cache gets the full
        run's own slot back when it ends.

        An edit that quantizes what the committed one does (evictions only change what is hidden) borrows the full
        run's own cache, whose own slot is put back afterwards: nothing is copied. Otherwise the run gets
        :attr:`scratch`, kept between runs: filled once from the original K/V; afterwards only slots that the
        previous run quantized and this one does not are copied back, and the quantization is written (all layers at
        once, in place) only when it is not the one the buffers hold, so a click on the quantization of the previous
        one quantizes nothing."""
        plan = self.plan(edit)
        if plan != self.plan(self.committed):
            yield self._quantized(session, edit, plan)
            return
        if "own" not in self.views:
            self.views["own"] = tuple(t[:, :, self.at:] for t in self.buffers)  # (L, KV, 1, D) each
        own = tuple(t.clone() for t in self.views["own"])  # the run overwrites them
        self.edited = self.buffers
        try:
            yield self._over("buffers")
        finally:
            for view, slot in zip(self.views["own"], own):
                view.copy_(slot)

    def _quantized(self, session: Session, edit: Edit, plan: tuple) -> Cache:
        """The scratch cache holding ``edit``'s quantization ``plan`` (see :meth:`lent`)."""
        if self.originals is None:
            self.originals = (tuple(t[:, :, :self.at] for t in self.buffers) if not self.committed.rewrites
                              else stacked(prefix_kv(session, self.at)))
        if self.scratch is None:
            self.scratch = tuple(torch.empty_like(t) for t in self.buffers)
            for scratch, originals in zip(self.scratch, self.originals):
                scratch[:, :, :self.at] = originals
        elif plan != self.written and (plan[2] is not None or (self.written and self.written[2] is not None)
                                       or (self.written and self.written[0][0][2] != plan[0][0][2])):
            for scratch, originals in zip(self.scratch, self.originals):  # prunings, merges, exact layers: all anew
                scratch[:, :, :self.at] = originals
            self.written, self.finished = (), False
        elif plan != self.written:  # restore the slots no longer quantized; the others are quantized again below
            for index, ((_, before), (_, now)) in enumerate(zip(self.written[:2], plan[:2])):
                stale = _widths(before, self.at).keys() - _widths(now, self.at).keys()
                if stale:
                    slots = torch.tensor(sorted(stale), device=self.scratch[index].device)
                    self.scratch[index][:, :, slots] = self.originals[index][:, :, slots]
        if plan != self.written or not self.finished:
            pending = self._pending(edit, plan)
            self.written, self.finished = plan, False  # noted first: a quantization that fails midway is redone
            keys, values = (t[:, :, :self.at] for t in self.scratch)  # (L, KV, at, D)
            source = tuple(t.flatten(0, 1) for t in self.originals)
            if plan[2] is not None:  # pruned and merged first, then quantized in place
                for layer, (own_keys, own_values) in enumerate(zip(*self.originals)):
                    keys[layer], values[layer] = reshaped(own_keys, own_values, layer, *plan[2])
                source = None
            if edit.keys.per_layer or edit.values.per_layer or edit.keys.no_rope or edit.exact_layers:  # layer by layer
                for layer in range(len(keys)):
                    pending.quantize_(keys[layer], values[layer], source=None if source is None else tuple(
                        t[layer] for t in self.originals), layer=layer)
            else:
                pending.quantize_(keys.flatten(0, 1), values.flatten(0, 1), source=source)
            self.finished = True
        self.edited = self.scratch
        return self._over("scratch")

    def _pending(self, edit: Edit, plan: tuple) -> Edit:
        """The part of ``edit``'s quantization ``plan`` the scratch buffers lack: all of it, except that a kind
        quantized per token (each slot on its own scales) whose last writing finished with the same quantizer
        rewrites only the slots whose bit-width changed (those slots' bits are the same as when all are written)."""
        done = self.written if self.finished else ((None, []), (None, []))
        todo = []
        for (quantizer, groups), (before, written) in zip(plan[:2], done[:2]):
            widths, old = _widths(groups, self.at), _widths(written, self.at)
            if quantizer == before and quantizer[0].axis == "token" and not quantizer[0].per_layer:
                widths = {slot: width for slot, width in widths.items() if old.get(slot) != width}
            todo.append(widths)
        return Edit(key_bits=todo[0], value_bits=todo[1], keys=edit.keys, values=edit.values,
                    head_widths=edit.head_widths, exact_layers=edit.exact_layers)

    def continuation(self, session: Session, steps: int) -> list[int]:
        """The full run's greedy continuation of ``steps`` tokens, on a cache that stores its new slots as this step
        stored its own (a full cache of ``at + 1`` slots: the first new slot reallocates, ``buffers`` stay as they
        are)."""
        if steps not in self.continuations:
            cache = kv_cache.over(layer_views(self.buffers), self.at + 1, written=self.writes,
                                  recurrent=recurrent.layers(self.after), indexed=self.indexed_after)
            self.continuations[steps] = greedy(session, cache, self.hidden, self.logits, self.position, steps)
        return self.continuations[steps]


def _widths(groups: list, n: int) -> dict[int, int]:
    """The slots of ``(bit-width, slots)`` groups (slots a slice or a list, below ``n``) → their bit-width."""
    return {slot: width for width, slots in groups for slot in (range(n)[slots] if isinstance(slots, slice) else slots)}


def kept_full_step(session: Session, at: int, full: Edit, hidden: torch.Tensor | None) -> FullStep:
    """The unedited run of slot ``at``, memoized per session cache version, step, committed edit and mask mode; the
    two most recently used are kept, so switching between an eviction (masked runs) and quantization alone stays
    warm."""
    def compute() -> FullStep:
        slot = session.transcript.slots[at]
        buffers = stacked(prefix_kv(session, at, full), room=1)
        probe = FullStepProbe(hidden, session.lm.attention)
        writes = session.commits.writes(at)
        states, indexed = states_before(session, at), kv_cache.indexer_keys(session.cache, at)
        out, cache = run(session, kv_cache.over(layer_views(buffers), at, written=writes, recurrent=recurrent.layers(
            states), indexed=indexed), slot.id, slot.position, probe)
        probe.finish(buffers)
        return FullStep(at, slot.position, probe, out.logits[0, -1].float(), out.hidden_states, hidden,
                        session.transcript.segments()[:at], full, buffers, writes=writes, states=states,
                        after=recurrent.live_states(cache), indexed=indexed,
                        indexed_after=kv_cache.indexer_keys(cache, at + 1))

    return session.memoized("full_steps", (at, full.key, hidden is not None), compute, keep=2)


def prefix_kv(session: Session, at: int, edit: Edit | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the K/V ``(KV, at, D)`` of slots ``0..at-1`` as the model computed them (views), with ``edit``'s
    quantization applied (copies) when given."""
    originals = [session.commits.step_kv(layer, at) for layer in range(session.lm.layers)]
    return originals if edit is None else [edit.quantized(*kv, layer) for layer, kv in enumerate(originals)]


def stacked(prefix: list[KV], room: int = 0) -> KV:
    """Per-layer K/V ``(KV, n, D)`` → keys and values ``(L, KV, n + room, D)`` holding them first (the room unset),
    so that what follows is computed for all layers at once (keys and values may differ in width: latent attention)."""
    kv, n, _ = prefix[0][0].shape
    buffers = tuple(t.new_empty(len(prefix), kv, n + room, t.shape[-1]) for t in prefix[0])
    for layer, kv_pair in enumerate(prefix):
        for buffer, tensor in zip(buffers, kv_pair):
            buffer[layer, :, :n] = tensor
    return buffers


def layer_views(buffers: KV) -> list[KV]:
    """Keys and values ``(L, KV, n, D)`` → per layer the views ``(1, KV, n, D)`` a cache is built over."""
    return [(keys[None], values[None]) for keys, values in zip(*buffers)]


def run(session: Session, cache: Cache, token: int, position: int, probe: Probe):
    """One decode step of ``token`` at ``position`` on ``cache`` (which it extends)."""
    lm = session.lm
    with torch.no_grad(), probing(probe):
        out = lm.model(input_ids=torch.tensor([[token]], device=lm.device),
                       position_ids=torch.tensor([[position]], device=lm.device),
                       cache=cache, use_cache=True, output_hidden_states=True, logits_to_keep=1)
    return out, cache
