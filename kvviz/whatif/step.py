"""What-if at a step (docs/math.md §3–§6): re-run the real decode step of one slot on its cache as it stood then, once
unedited ("full") and once with an Edit applied to a copy ("edited"), and measure the difference.

The two runs are separate passes at the slot's true absolute position, so an edit that changes nothing changes no bit;
the full run is kept per session until its cache changes, so trying edit after edit re-runs only the edited pass. Evicted
slots are hidden from the edited run per (layer, KV head) by its probe; this equals removing them (tested). The probe
also computes, per layer and query head, the evicted mass ρ and the *isolated* change of the attention output (the
full-cache query with the edited cache: the closed form of docs/math.md §3, or the two-term split of §4 when K/V change), while
the *propagated* change is read from the edited run itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from kvviz import attention_math as am
from kvviz import sparse
from kvviz.edit.check import check_edit
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.numbers import top_k
from kvviz.recorder import Probe
from kvviz.session import Session
from kvviz.whatif.continuation import Continuation, compared, greedy
from kvviz.whatif.full_step import FullStep, kept_full_step, run
from kvviz.whatif.memory import CacheBytes, cache_memory
from kvviz.whatif.metrics import NextToken, compare


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
    outside: list[bool] = field(default_factory=list)  # per slot: outside the layer's sliding window (α = 0)
    sink: tuple[float, float, float] | None = None  # a learned sink's mass: full α_sink, α_sink/(1−ρ), edited run's
    unread: list[bool] = field(default_factory=list)  # sparse selection: per slot, not read by the full run
    admitted: list[bool] = field(default_factory=list)  # … read by the edited run, not by the full run
    index_scores: list[float] = field(default_factory=list)  # … the full run's indexer scores, its reason to read


@dataclass
class WhatIf:
    at: int
    position: int
    token: int
    edit: Edit
    next_token: NextToken
    heads: dict[str, torch.Tensor]  # name -> (L, H): rho, delta_isolated, weight_term, content_term, delta_propagated,
    # and with learned sinks sink (the full run's α_sink) and sink_edited (the edited run's)
    detail: Detail
    hidden_delta: list[float]  # ‖h̃ − h‖ after the embeddings and after each layer
    memory: CacheBytes
    continuation: Continuation | None

    def __repr__(self) -> str:  # the plain-text output (a notebook shows HTML: kvviz.notebook.reprs)
        nt = self.next_token
        top1 = f"{nt.full[0].text!r} kept" if nt.full[0].id == nt.edited[0].id else \
            f"{nt.full[0].text!r} → {nt.edited[0].text!r}"
        return (f"WhatIf(at={self.at}, kl={nt.kl:.6g}, tv={nt.tv:.4g}, top1 {top1}, "
                f"bytes {self.memory.edited_bytes:,} of {self.memory.full_bytes:,})")

    def rho(self, layer: int, head: int | None) -> float:
        """ρ of query head ``head`` of ``layer`` (the evicted share of its attention), or with ``head`` None the mean
        over the layer's query heads — as the strip's shading reads attention."""
        rho = self.heads["rho"][layer]  # (H,)
        return float(rho.mean() if head is None else rho[head])

    def sink(self, layer: int, head: int | None) -> tuple[float, float] | None:
        """A learned sink's mass ``(full, edited)`` for query head ``head`` of ``layer`` (``None``: the mean over the
        layer's heads); None for a model without sinks."""
        if "sink" not in self.heads:
            return None
        full, edited = self.heads["sink"][layer], self.heads["sink_edited"][layer]  # (H,)
        return (float(full.mean()), float(edited.mean())) if head is None else (float(full[head]), float(edited[head]))

    def to_dict(self) -> dict:
        return {"at": self.at, "position": self.position, "token": self.token, "edit": self.edit.to_dict(),
                "next_token": self.next_token.to_dict(),
                "heads": {name: values.tolist() for name, values in self.heads.items()}, "detail": asdict(self.detail),
                "hidden_delta": self.hidden_delta, "memory": self.memory.to_dict(),
                "continuation": None if self.continuation is None else asdict(self.continuation)}


class EditedStepProbe(Probe):
    """The edited run: hides evicted slots and measures, per layer and query head, ρ and the isolated Δo — the change
    of the layer's output with the full run's query and own K/V on the edited cache — and the propagated Δo (the
    edited run's own output). The isolated Δo is computed for all layers at once after the run: the closed form of
    §3 for evictions alone, §4's two terms when the edit rewrites K/V: quantized, pruned or merged (docs/math.md).

    With sparse selection (DSA) an eviction changes what the indexer picks: the edited run reads the next slots of its
    ranking. The isolated Δo is then §4's weight term with α̂ over the slots the indexer picks for the full run's query
    on the edited cache (the top of the full run's scores among the slots kept), and the detail's edited weights are
    over the slots the edited run read."""

    def __init__(self, full: FullStep, rewrites: bool, hidden: torch.Tensor, new: torch.Tensor,
                 detail: tuple[int, int], masked: bool):
        self.full, self.rewrites = full, rewrites  # rewrites: the edit changes K/V (quantized, pruned, merged)
        self.hidden, self.masked, self.detail = hidden, masked, detail
        alpha = full.probe.alpha  # (L, H, n)
        self.new = am.expand_kv(new, alpha.shape[1], dim=1)  # (L, H, n): newly evicted
        self.rho = am.evicted_mass(alpha, self.new)  # (L, H)
        self.outputs: list[torch.Tensor] = []  # (1, 1, H, D) per layer, as the run gives them
        self.used: torch.Tensor | None = None  # (H, n): the weights the edited run used at the detail layer
        self._alpha_hat: torch.Tensor | None = None  # (L, H, n): see _edited_weights
        self.sparse, self.unread = full.probe.read is not None, None
        if self.sparse:  # (L, 1, n): not picked for the full run's query on the edited cache
            self.unread = ~sparse.top(full.probe.index_scores, ~hidden, full.probe.rule.reads)
            self.read: list[torch.Tensor] = []  # (n,) per layer: what the edited run read
        # made once, additive: SDPA would turn a boolean mask into this in every layer
        dtype = full.buffers[0].dtype
        self.visible = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill_(
            hidden, float("-inf"))[:, None, :, None].unbind(0) if masked else None  # (1, KV, 1, n) per layer

    def on_query(self, layer, query, key, value):
        if layer == self.detail[0]:
            rule = self.full.probe.rule
            self._seen = (query[0], rule.keyed(key[0], value[0]))  # the detail layer's query and cache
            if not self.sparse:
                self._weigh(self.hidden[layer])
        return self.visible[layer] if self.masked else None

    def _weigh(self, hidden: torch.Tensor) -> None:
        """:attr:`used`: the weights the edited run used at the detail layer, of its query and cache, ``hidden``
        ``(KV, n)`` hidden from it."""
        query, keys = self._seen
        self.used = self.full.probe.rule.weights(query, keys, self.detail[0], hidden, torch.float64)[:, 0]

    def on_read(self, layer, read, scores):
        self.read.append(read[0, -1])
        if layer == self.detail[0]:
            self._weigh(self.hidden[layer] | ~read[0, -1])

    def on_output(self, layer, output):
        self.outputs.append(output)

    def _quantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """docs/math.md §4 for all layers at once: ``Σ (α̂ − α) v`` and ``Σ α̂ (v̂ − v)`` ``(L, H, D)``, with α̂ the full run's
        queries' weights on the edited cache (the kept buffers after the run). The step's own key and value are the
        full run's: its score is the full run's own score, and its ``v̂ − v`` is 0."""
        rule = self.full.probe.rule
        values_hat, values = rule.carried(*self.full.edited), rule.carried(*self.full.buffers)  # (L, KV, n, D)
        alpha_hat = self._edited_weights()
        error = values_hat - values
        error[..., -1, :] = 0
        return tuple(map(rule.project, am.quantization_split(self.full.probe.alpha, alpha_hat, values, error)))

    def _edited_weights(self) -> torch.Tensor:
        """α̂ ``(L, H, n)``: the weights of the full run's queries on the edited cache (α′ for evictions alone). The
        step's own key is the full run's: its score is the full run's own score. Computed once per run (§4's split
        and a sink's share both read it)."""
        if self._alpha_hat is not None:
            return self._alpha_hat
        full = self.full.probe
        keys = full.rule.keyed(*(self.full.edited if self.rewrites else self.full.buffers))
        scores = full.rule.scores(full.queries, keys)  # (L, H, 1, n)
        scores[..., -1:] = full.own_scores
        hidden = self.hidden if self.masked else None
        if self.sparse:  # over the slots the indexer picks for the full run's query on the edited cache
            hidden = self.unread if hidden is None else hidden | self.unread
        self._alpha_hat = full.rule.softmax(scores, None, hidden, torch.float64)[..., 0, :]
        return self._alpha_hat

    def _evicted(self) -> torch.Tensor:
        """Isolated Δo ``(L, H, D)`` of evictions alone: ``o′ − o`` with ``o′ = (o − Σ α_e v_e)/(1 − ρ)``, i.e.
        ``(ρ o − Σ α_e v_e)/(1 − ρ)`` over the evicted columns only; a layer where ρ rounds to 1 (a head on an
        attention sink) is recomputed directly. With latent attention, computed on the latent and projected
        (:meth:`AttentionRule.project`)."""
        full = self.full.probe
        columns = self.new.flatten(0, 1).any(0).nonzero()[:, 0]
        alpha, new = full.alpha[..., columns], self.new[..., columns]  # (L, H, e)
        values = full.rule.carried(*self.full.buffers)  # (L, KV, n, D)
        evicted_values = values[:, :, columns]  # (L, KV, e, D)
        o = full.attended
        if float(self.rho.max()) < 1:
            return full.rule.project(am.evicted_change(o, alpha, evicted_values, new, self.rho))
        keys = full.rule.keyed(*self.full.buffers)  # (L, KV, n, D): a latent cache's concatenated only here
        rows = []
        for layer in range(len(o)):
            if bool((self.rho[layer] >= 1).any()):
                alpha_hat = full.rule.weights(full.queries[layer], keys[layer], layer, self.hidden[layer], torch.float64)
                delta = am.output(alpha_hat[:, 0] - full.alpha[layer], values[layer])
            else:
                delta = am.evicted_change(o[layer], alpha[layer], evicted_values[layer], new[layer],
                                             self.rho[layer])
            rows.append(delta.double())
        return full.rule.project(torch.stack(rows))

    def results(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """After the run: the per-head maps ``(L, H)`` by name, and the detail head's rows."""
        if self.rewrites or self.sparse:  # DSA: the read set may change, α′ is not the edited weights
            weight, content = self._quantized()
            isolated = weight + content
            norms = {"delta_isolated": isolated.norm(dim=-1), "weight_term": weight.norm(dim=-1),
                     "content_term": content.norm(dim=-1)}
        else:  # evictions alone: all of Δo is the weights' term
            isolated = weight = self._evicted()
            content = None
            norms = dict.fromkeys(("delta_isolated", "weight_term"), isolated.norm(dim=-1))
            norms["content_term"] = torch.zeros_like(self.rho)
        propagated = torch.stack(self.outputs)[:, 0, 0].float() - self.full.probe.outputs
        maps = {"rho": self.rho, **norms, "delta_propagated": propagated.norm(dim=-1)}
        if self.full.probe.rule.sinks:  # the mass the sinks took, before and after (eviction alone: α_sink/(1−ρ))
            maps["sink"] = am.sink_mass(self.full.probe.alpha)
            maps["sink_edited"] = am.sink_mass(self._edited_weights())
        layer, head = self.detail
        alpha, new, rho = self.full.probe.alpha[layer, head], self.new[layer, head], self.rho[layer, head]
        if float(rho) >= 1:
            am.renormalized(alpha, new)  # refuses ρ = 1 where it shows
        rows = {"alpha": alpha, "renorm": alpha.masked_fill(new, 0.0) / (1 - rho), "edited": self.used[head],
                "new": new, "isolated": isolated[layer, head]}
        if "sink" in maps:
            sink = float(maps["sink"][layer, head])
            rows["sink"] = (sink, sink / (1 - float(rho)), float(am.sink_mass(self.used[head])))
        if self.sparse:
            rows["unread"] = ~self.full.probe.read[layer, 0]
            rows["admitted"] = self.read[layer] & rows["unread"]
            rows["index_scores"] = self.full.probe.index_scores[layer, 0]
        rows |= {"weight": weight[layer, head], "content": content[layer, head]} if content is not None else {
            "weight": rows["isolated"], "content": torch.zeros(isolated.shape[-1], dtype=isolated.dtype)}
        return maps, rows


def _validate(session: Session, edit: Edit, at: int, layer: int, head: int, topk: int, continuation: int) -> None:
    lm = session.lm
    if not 0 <= at < len(session):
        raise KvvizError(f"slot {at} is not cached (the cache holds slots 0..{len(session) - 1})")
    if not 0 <= layer < lm.layers or not 0 <= head < lm.heads:
        raise KvvizError(f"layer {layer} / head {head} do not exist ({lm.layers} layers, {lm.heads} query heads)")
    top_k(topk, lm.config.vocab_size)
    if isinstance(continuation, bool) or not isinstance(continuation, int) or continuation < 0:
        raise KvvizError(f"the continuation length must be a whole number of at least 0, got {continuation!r}")
    if session.transcript.slots[at].position + continuation >= lm.context_window:
        raise KvvizError("the continuation would run past the context window")
    check_edit(lm, session.transcript, edit, at)


def what_if(session: Session, edit: Edit, at: int | None = None, layer: int = 0, head: int = 0, topk: int = 10,
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
    masked = bool(hidden_edited.any()) or not edited.rewrites
    full_step = kept_full_step(session, at, full, hidden_full if masked else None)
    probe = EditedStepProbe(full_step, edited.rewrites, hidden_edited, hidden_edited & ~hidden_full, (layer, head),
                            masked)
    with full_step.lent(session, edited) as cache:
        out, cache = run(session, cache, slot.id, slot.position, probe)
        logits = out.logits[0, -1].float()
        # the continuation copies the run's cache at its first step, before a lent one is given back
        edited_ids = (greedy(session, cache, hidden_edited if masked else None, logits, slot.position, continuation)
                      if continuation else None)
    maps, rows = probe.results()
    follow = None
    if continuation:
        follow = compared(session, full_step.continuation(session, continuation), edited_ids)
    return WhatIf(
        at=at, position=slot.position, token=slot.id, edit=edit,
        next_token=compare(full_step.reference, logits, topk, session.piece),
        heads=maps,
        detail=_detail(rows, layer, head, at, lm.attention.outside(at, at + 1)[layer].tolist()),
        hidden_delta=_hidden_delta(out.hidden_states, full_step.hidden_states),
        memory=cache_memory(edited, hidden_edited[:, :, :at].cpu(), full_step.segments, lm.geometry.cached_widths,
                            lm.dtype, lm.attention.outside(at, at)),
        continuation=follow,
    )


def _hidden_delta(edited: tuple, full: tuple) -> list[float]:
    """‖h̃ − h‖ of each hidden state ``(1, 1, d)`` (embeddings, then every layer), in one go: a few operations instead
    of four per layer."""
    return (torch.stack(edited) - torch.stack(full)).float().flatten(1).norm(dim=1).tolist()


def _detail(rows: dict[str, torch.Tensor], layer: int, head: int, at: int, outside: list[bool]) -> Detail:
    evicted = rows["new"].tolist()
    hide = lambda values: [None if gone else v for v, gone in zip(values.tolist(), evicted)]  # noqa: E731
    return Detail(layer, head, list(range(at + 1)), rows["alpha"].tolist(), hide(rows["renorm"]),
                  hide(rows["edited"]), rows["isolated"].tolist(), rows["weight"].tolist(), rows["content"].tolist(),
                  outside, rows.get("sink"), *(rows[name].tolist() if name in rows else [] for name in
                                               ("unread", "admitted", "index_scores")))
