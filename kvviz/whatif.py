"""What-if at a step (seed §10–§16): re-run the real decode step of one slot on its cache as it stood then, once
unedited ("full") and once with an Edit applied to a copy ("edited"), and measure the difference.

The two runs are separate passes at the slot's true absolute position, so an edit that changes nothing changes no bit;
the full run is kept per session until its cache changes, so trying edit after edit re-runs only the edited pass. Evicted
slots are hidden from the edited run per (layer, KV head) by its probe; this equals removing them (tested). The probe
also computes, per layer and query head, the evicted mass ρ and the *isolated* change of the attention output (the
full-cache query with the edited cache: the closed form of §10, or the two-term split of §12 when quantizing), while
the *propagated* change is read from the edited run itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from transformers import Cache

from kvviz import attention as math
from kvviz import cache as kv_cache
from kvviz.cache import KV
from kvviz.continuation import Continuation, compared, greedy
from kvviz.edits import Edit
from kvviz.errors import KvvizError
from kvviz.memory import cache_memory
from kvviz.metrics import NextToken, compare
from kvviz.recorder import Probe, probing



@dataclass
class Detail:
    """One head's view: the visible slots with α (full), α′ = α/(1−ρ) and the weights the edited run used."""

    layer: int
    head: int
    slots: list[int]
    alpha_full: list[float]
    alpha_renorm: list[float | None]
    alpha_edited: list[float | None]
    delta_isolated: list[float] = field(default_factory=list)  # Δo (D,) of this head, isolated
    weight_term: list[float] = field(default_factory=list)  # Σ (α̂−α) v
    content_term: list[float] = field(default_factory=list)  # Σ α̂ ε^V


@dataclass
class WhatIf:
    at: int
    position: int
    token: int
    edit: Edit
    next_token: NextToken
    heads: dict[str, list[list[float]]]  # name -> [layer][query head]
    detail: Detail
    hidden_delta: list[float]  # ‖h̃ − h‖ after the embeddings and after each layer
    memory: dict
    continuation: Continuation | None

    def to_dict(self) -> dict:
        return {"at": self.at, "position": self.position, "token": self.token, "edit": self.edit.to_dict(),
                "next_token": self.next_token.to_dict(), "heads": self.heads, "detail": asdict(self.detail),
                "hidden_delta": self.hidden_delta, "memory": self.memory,
                "continuation": None if self.continuation is None else asdict(self.continuation)}


class FullStepProbe(Probe):
    """The unedited run: hides what the session's own committed edit hid, and keeps what the edited run compares to:
    the queries and the attention outputs per layer while the run is on; :meth:`finish` adds α and o."""

    def __init__(self, hidden: torch.Tensor | None, scaling: float):
        self.hidden, self.scaling = hidden, scaling
        self.queries, self.outputs = [], []

    def on_query(self, layer, query, key, value):
        self.queries.append(query[0])  # (H, 1, D)
        return None if self.hidden is None else ~self.hidden[layer][None]

    def on_output(self, layer, output):
        self.outputs.append(output[0, 0].float())  # (H, D)

    def finish(self, buffers: KV) -> None:
        """After the run, on its cache ``buffers`` (keys, values ``(L, KV, n, D)``), for all layers at once: the queries
        ``(L, H, 1, D)``, the step's score with its own key ``(L, H, 1, 1)``, α ``(L, H, n)`` float64, o = Σ α v (for
        the closed form of §10) and the attention outputs ``(L, H, D)``."""
        keys, values = buffers
        self.queries, self.outputs = torch.stack(self.queries), torch.stack(self.outputs)
        scores = math.scores(self.queries, keys, self.scaling)  # (L, H, 1, n)
        self.own_scores = scores[..., -1:].clone()
        self.alpha = math.visible_softmax(scores, self.hidden, dtype=torch.float64)[..., 0, :]
        self.attended = math.output(self.alpha, values)


class EditedStepProbe(Probe):
    """The edited run: hides evicted slots and measures, per layer and query head, ρ and the isolated Δo — the change
    of the layer's output with the full run's query and own K/V on the edited cache — and the propagated Δo (the
    edited run's own output). The isolated Δo is computed for all layers at once after the run: the closed form of
    §10 for evictions alone, §12's two terms when quantizing."""

    def __init__(self, full: FullStep, quantizes: bool, hidden: torch.Tensor, new: torch.Tensor,
                 detail: tuple[int, int], masked: bool):
        self.full, self.quantizes = full, quantizes
        self.hidden, self.masked, self.detail = hidden, masked, detail
        alpha = full.probe.alpha  # (L, H, n)
        self.new = math.expand_kv(new, alpha.shape[1], dim=1)  # (L, H, n): newly evicted
        self.rho = math.evicted_mass(alpha, self.new)  # (L, H)
        self.outputs: list[torch.Tensor] = []
        self.used: torch.Tensor | None = None  # (H, n): the weights the edited run used at the detail layer

    def on_query(self, layer, query, key, value):
        if layer == self.detail[0]:
            self.used = math.causal_weights(query[0], key[0], self.full.probe.scaling, self.hidden[layer],
                                            torch.float64)[:, 0]
        return ~self.hidden[layer][None] if self.masked else None

    def on_output(self, layer, output):
        self.outputs.append(output[0, 0])

    def _quantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """§12 for all layers at once: ``Σ (α̂ − α) v`` and ``Σ α̂ (v̂ − v)`` ``(L, H, D)``, with α̂ the full run's
        queries' weights on the edited cache (the kept buffers after the run). The step's own key and value are the
        full run's: its score is the full run's own score, and its ``v̂ − v`` is 0."""
        full = self.full.probe
        keys_hat, values_hat = self.full.scratch  # (L, KV, n, D)
        values = self.full.buffers[1]
        scores = math.scores(full.queries, keys_hat, full.scaling)  # (L, H, 1, n)
        scores[..., -1:] = full.own_scores
        alpha_hat = math.visible_softmax(scores, self.hidden if self.masked else None, torch.float64)[..., 0, :]
        error = values_hat - values
        error[..., -1, :] = 0
        return math.quantization_split(full.alpha, alpha_hat, values, error)

    def _evicted(self) -> torch.Tensor:
        """Isolated Δo ``(L, H, D)`` of evictions alone: ``o′ − o`` with ``o′ = (o − Σ α_e v_e)/(1 − ρ)`` over the
        evicted columns only; a layer where ρ rounds to 1 (a head on an attention sink) is recomputed directly."""
        full = self.full.probe
        columns = self.new.flatten(0, 1).any(0).nonzero()[:, 0]
        alpha, new = full.alpha[..., columns], self.new[..., columns]  # (L, H, e)
        keys, values = self.full.buffers  # (L, KV, n, D)
        evicted_values = values[:, :, columns]  # (L, KV, e, D)
        o = full.attended
        if not bool((self.rho >= 1).any()):
            return math.evicted_output(o, alpha, evicted_values, new) - o
        rows = []
        for layer in range(len(o)):
            if bool((self.rho[layer] >= 1).any()):
                alpha_hat = math.causal_weights(full.queries[layer], keys[layer], full.scaling, self.hidden[layer],
                                                torch.float64)
                delta = math.output(alpha_hat[:, 0] - full.alpha[layer], values[layer])
            else:
                delta = math.evicted_output(o[layer], alpha[layer], evicted_values[layer], new[layer]) - o[layer]
            rows.append(delta.double())
        return torch.stack(rows)

    def results(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """After the run: the per-head maps ``(L, H)`` by name, and the detail head's rows."""
        if self.quantizes:
            weight, content = self._quantized()
            isolated = weight + content
        else:
            isolated = weight = self._evicted()
            content = torch.zeros_like(isolated)
        propagated = torch.stack(self.outputs).float() - self.full.probe.outputs
        maps = {"rho": self.rho, "delta_isolated": isolated.norm(dim=-1), "weight_term": weight.norm(dim=-1),
                "content_term": content.norm(dim=-1), "delta_propagated": propagated.norm(dim=-1)}
        layer, head = self.detail
        alpha = self.full.probe.alpha[layer]
        rows = {"alpha": alpha[head], "renorm": math.renormalized(alpha[head], self.new[layer, head]),
                "edited": self.used[head], "new": self.new[layer, head], "isolated": isolated[layer, head],
                "weight": weight[layer, head], "content": content[layer, head]}
        return maps, rows


def _validate(session, edit: Edit, at: int, layer: int, head: int, topk: int, continuation: int) -> None:
    lm = session.lm
    if not 0 <= at < len(session):
        raise KvvizError(f"slot {at} is not cached (the cache holds slots 0..{len(session) - 1})")
    if not 0 <= layer < lm.layers or not 0 <= head < lm.heads:
        raise KvvizError(f"layer {layer} / head {head} do not exist ({lm.layers} layers, {lm.heads} query heads)")
    if topk < 1 or continuation < 0:
        raise KvvizError("top-k must be at least 1 and the continuation length non-negative")
    if session.transcript.slots[at].position + continuation >= lm.context_window:
        raise KvvizError("the continuation would run past the context window")
    edit.validate(at, lm.layers, lm.kv_heads, lm.head_dim)


@dataclass
class FullStep:
    """The unedited run of one step, kept by the session until its cache changes: clicking through edits at the
    same step re-runs only the edited pass, on a cache kept here too (:meth:`edited_cache`)."""

    at: int
    position: int
    probe: FullStepProbe
    logits: torch.Tensor
    hidden_states: tuple
    hidden: torch.Tensor | None
    segments: list[str]  # of slots 0..at-1
    unquantized: bool  # the committed edit quantizes nothing: the full run's cache holds the original K/V
    buffers: KV  # (L, KV, at + 1, D) each: the keys and values of the full run's cache, its own slot included
    continuations: dict = field(default_factory=dict)
    originals: KV | None = None  # (L, KV, at, D) each: slots 0..at-1 as the model computed them
    scratch: KV | None = None  # (L, KV, at + 1, D) each: the edited runs' cache
    written: tuple = ()  # the quantization (see :meth:`plan`) last written into the scratch buffers
    finished: bool = False  # whether that writing finished: the buffers then hold all of it

    def plan(self, edit: Edit) -> tuple:
        """What ``edit`` writes into the cache: per kind, its quantizer and its ``(bit-width, slots)`` groups."""
        return tuple((edit.keys if kind == "key" else edit.values, edit.groups(kind, self.at)) for kind in ("key", "value"))

    def edited_cache(self, session, edit: Edit) -> Cache:
        """A cache for an edited run: slots ``0..at-1`` with ``edit``'s quantization, and room for this step's own K/V.

        Its buffers (:attr:`scratch`) are kept between runs: filled once from the original K/V; afterwards only slots
        that the previous run quantized and this one does not are copied back, and the quantization is written (all
        layers at once, in place) only when it is not the one the buffers hold — so an eviction's run copies nothing,
        and one on the quantization of the previous click quantizes nothing."""
        if self.originals is None:
            self.originals = (tuple(t[:, :, :self.at] for t in self.buffers) if self.unquantized
                              else _stacked(_prefix(session, self.at)))
        plan = self.plan(edit)
        if self.scratch is None:
            self.scratch = tuple(torch.empty_like(t) for t in self.buffers)
            for scratch, originals in zip(self.scratch, self.originals):
                scratch[:, :, :self.at] = originals
        elif plan != self.written:  # restore the slots no longer quantized; the others are quantized again below
            for index, ((_, before), (_, now)) in enumerate(zip(self.written, plan)):
                stale = _slots(before, self.at) - _slots(now, self.at)
                if stale:
                    slots = torch.tensor(sorted(stale), device=self.scratch[index].device)
                    self.scratch[index][:, :, slots] = self.originals[index][:, :, slots]
        if plan != self.written or not self.finished:
            self.written, self.finished = plan, False  # noted first: a quantization that fails midway is redone
            keys, values = (t[:, :, :self.at].flatten(0, 1) for t in self.scratch)  # (L·KV, at, D)
            edit.quantize_(keys, values, source=tuple(t.flatten(0, 1) for t in self.originals))
            self.finished = True
        return kv_cache.over(_layers(self.scratch), self.at)

    def continuation(self, session, steps: int) -> list[int]:
        if steps not in self.continuations:
            cache = kv_cache.build(session.lm.config, _layers(self.buffers))
            self.continuations[steps] = greedy(session, cache, self.hidden, self.logits, self.position, steps)
        return self.continuations[steps]


def _slots(groups: list, n: int) -> set[int]:
    """The slots of ``(bit-width, slots)`` groups (slots a slice or a list, below ``n``) as one set."""
    return {slot for _, slots in groups for slot in (range(n)[slots] if isinstance(slots, slice) else slots)}


def _full_step(session, at: int, full: Edit, hidden: torch.Tensor | None) -> FullStep:
    """The unedited run of slot ``at``, memoized per session cache version, step, committed edit and mask mode; the
    two most recent are kept, so switching between an eviction (masked runs) and quantization alone stays warm."""
    steps = session.memo.setdefault("full_steps", {})
    key = (session.version, at, repr(full.to_dict()), hidden is not None)
    if key not in steps:
        slot = session.transcript.slots[at]
        buffers = _stacked(_prefix(session, at, full), room=1)
        probe = FullStepProbe(hidden, session.lm.scaling)
        out, _ = _run(session, kv_cache.over(_layers(buffers), at), slot.id, slot.position, probe)
        probe.finish(buffers)
        recent = [k for k in steps if k[0] == session.version][-1:]  # keep one more run of this cache version
        for old in set(steps) - set(recent):
            del steps[old]
        steps[key] = FullStep(at, slot.position, probe, out.logits[0, -1].float(), out.hidden_states, hidden,
                              session.transcript.segments()[:at], not full.quantizes, buffers)
    return steps[key]


def _prefix(session, at: int, edit: Edit | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the K/V ``(KV, at, D)`` of slots ``0..at-1`` as the model computed them (views), with ``edit``'s
    quantization applied (copies) when given."""
    originals = [session.commits.original_kv(layer, at) for layer in range(session.lm.layers)]
    return originals if edit is None else [edit.quantized(*kv) for kv in originals]


def _stacked(prefix: list[KV], room: int = 0) -> KV:
    """Per-layer K/V ``(KV, n, D)`` → keys and values ``(L, KV, n + room, D)`` holding them first (the room unset),
    so that what follows is computed for all layers at once."""
    keys = prefix[0][0]
    kv, n, dim = keys.shape
    buffers = tuple(keys.new_empty(len(prefix), kv, n + room, dim) for _ in range(2))
    for layer, kv_pair in enumerate(prefix):
        for buffer, tensor in zip(buffers, kv_pair):
            buffer[layer, :, :n] = tensor
    return buffers


def _layers(buffers: KV) -> list[KV]:
    """Keys and values ``(L, KV, n, D)`` → per layer the views ``(1, KV, n, D)`` a cache is built over."""
    return [(keys[None], values[None]) for keys, values in zip(*buffers)]


def _run(session, cache: Cache, token: int, position: int, probe: Probe):
    """One decode step of ``token`` at ``position`` on ``cache`` (which it extends)."""
    lm = session.lm
    with torch.no_grad(), probing(probe):
        out = lm.model(input_ids=torch.tensor([[token]], device=lm.device),
                       position_ids=torch.tensor([[position]], device=lm.device),
                       cache=cache, use_cache=True, output_hidden_states=True, logits_to_keep=1)
    return out, cache


def what_if(session, edit: Edit, at: int | None = None, layer: int = 0, head: int = 0, topk: int = 10,
            continuation: int = 0) -> WhatIf:
    """Re-run the step of slot ``at`` (default: the newest cached slot) with and without ``edit``; see the module doc.

    The session is never modified. Raises :class:`KvvizError` for edits and arguments that do not fit.
    """
    lm = session.lm
    at = len(session) - 1 if at is None else at
    _validate(session, edit, at, layer, head, topk, continuation)
    full, edited = session.commits.step_edits(at, edit)
    shape = (at + 1, lm.layers, lm.kv_heads, lm.device)
    hidden_full, hidden_edited = full.evicted_mask(*shape), edited.evicted_mask(*shape)
    slot = session.transcript.slots[at]

    # Both runs take the same attention kernel, so an edit that changes nothing changes no bit. Masked unless the edit
    # only quantizes: an empty edit (the page's first view of a step) then keeps the full run that eviction clicks need.
    masked = bool(hidden_edited.any()) or not edited.quantizes
    full_step = _full_step(session, at, full, hidden_full if masked else None)
    probe = EditedStepProbe(full_step, edited.quantizes, hidden_edited, hidden_edited & ~hidden_full, (layer, head),
                            masked)
    out, cache = _run(session, full_step.edited_cache(session, edited), slot.id, slot.position, probe)
    maps, rows = probe.results()
    logits, full_logits = out.logits[0, -1].float(), full_step.logits
    follow = None
    if continuation:
        edited_ids = greedy(session, cache, hidden_edited if masked else None, logits, slot.position, continuation)
        follow = compared(session, full_step.continuation(session, continuation), edited_ids)
    return WhatIf(
        at=at, position=slot.position, token=slot.id, edit=edit,
        next_token=compare(full_logits, logits, topk, session.piece),
        heads={name: values.tolist() for name, values in maps.items()},
        detail=_detail(rows, layer, head, at),
        hidden_delta=[float((h - f).float().norm()) for h, f in zip(out.hidden_states, full_step.hidden_states)],
        memory=cache_memory(edited, hidden_edited[:, :, :at].cpu(), full_step.segments, lm.head_dim, lm.dtype),
        continuation=follow,
    )


def _detail(rows: dict[str, torch.Tensor], layer: int, head: int, at: int) -> Detail:
    evicted = rows["new"].tolist()
    hide = lambda values: [None if gone else v for v, gone in zip(values.tolist(), evicted)]  # noqa: E731
    return Detail(layer, head, list(range(at + 1)), rows["alpha"].tolist(), hide(rows["renorm"]),
                  hide(rows["edited"]), rows["isolated"].tolist(), rows["weight"].tolist(), rows["content"].tolist())
