"""kvviz's attention function, registered with transformers' AttentionInterface, and the probes it reports to.

The model is shared by every browser session, so the function itself holds no state: the probe of the call in
progress lives in a ``ContextVar`` that the caller sets around its forward pass (``with probing(probe): model(...)``).
Without a probe the function is plain SDPA (or transformers' eager attention when the caller asks for
``output_attentions`` or the model soft-caps its scores; kvviz's own softmax with a sink column for a model with
learned sinks, which SDPA cannot add). A probe may record the post-RoPE query, hide cached slots per KV head (what-if
masking) and read the per-head attention output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward  # llama's, with a soft-cap

from kvviz import latent as mla
from kvviz import sparse
from kvviz.attention_math import causal_mask, expand_kv, sink_softmax

ATTENTION_NAME = "kvviz"


class Probe:
    """Base probe: sees every attention call of one forward pass. Subclasses override what they need."""

    def on_query(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> torch.Tensor | None:
        """Called with ``query`` ``(B, H, q, D)`` post-RoPE and the whole ``key``/``value`` ``(B, KV, n, D)`` after
        the cache update (latent attention: the absorbed query, the latent and the RoPE key, :mod:`kvviz.latent`).

        May return a boolean visibility mask ``(B, KV, n)`` (True = attend; or the same as an additive float mask, 0 =
        attend and −inf = hidden, which a decode step uses as it is; a decode step's additive mask may also come
        shaped ``(B, KV, 1, n)``, as the kernel takes it) applied on top of the causal mask, or a boolean
        ``(B, KV, q, n)``: the whole mask of every query row, replacing the causal one (e.g. rows that are variants
        of one step, each seeing itself only).
        """
        return None

    def on_output(self, layer: int, output: torch.Tensor) -> None:
        """Called with the per-head attention output ``(B, q, H, D)`` (before ``o_proj``)."""

    def on_mixer(self, index: int, hidden: torch.Tensor) -> None:
        """Called with the input ``(B, q, hidden)`` of a hybrid model's recurrent layer ``index`` (its place among the
        recurrent layers, :mod:`kvviz.recurrent`)."""

    def on_read(self, layer: int, read: torch.Tensor, scores: torch.Tensor) -> None:
        """Called, in a model with sparse selection (DSA, :mod:`kvviz.sparse`), with the slots each query row reads,
        bool ``(B, q, n)`` (chosen among those the probe left visible), and the indexer's scores ``(B, q, n)``."""

    def select(self, layer: int, query: torch.Tensor, key: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor | None:
        """Called in a decode step (one query row) with its query ``(B, H, 1, D)``, the cached keys ``(B, KV, n, D)``
        and the slots it may see, bool ``(B, 1|H, 1, n)`` (its own among them): may return the slots it reads, bool
        ``(B, KV, 1, n)`` (a query-aware reader: RocketKV's hybrid sparse attention), or None (all it may see)."""
        return None

    def extra_reads(self, layer: int, n: int) -> torch.Tensor | None:
        """With sparse selection: the slots each query row reads besides those its indexer picks, bool ``(B, q, ≤ n)``
        over the first slots of the ``n`` (visible ones only count; None: none)."""
        return None


_probe: ContextVar[Probe | None] = ContextVar("kvviz_probe", default=None)


def current_probe() -> Probe | None:
    """The probe of the forward pass in progress on this thread/task (None: none)."""
    return _probe.get()


@contextmanager
def probing(probe: Probe) -> Iterator[Probe]:
    """Route the attention calls of the forward passes inside this block (this thread/task only) to ``probe``."""
    token = _probe.set(probe)
    try:
        yield probe
    finally:
        _probe.reset(token)


def _full_mask(
    mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor, visible: torch.Tensor | None
) -> torch.Tensor:
    """Boolean mask ``(B, 1|H, q, n)``: the causal mask (rebuilt when transformers skipped it), AND per-KV-head
    ``visible`` ``(B, KV, n)`` when given."""
    q_len, n = query.shape[2], key.shape[2]
    if visible is not None and visible.is_floating_point():
        visible = (visible == 0) if visible.dim() == 3 else (visible[:, :, 0] == 0)  # an additive mask
    per_head = None  # (B, H, 1, n); GQA: query head h reads KV head h // n_rep
    if visible is not None and visible.dim() == 4:  # every row's mask, given whole
        return expand_kv(visible.to(key.device), query.shape[1], dim=1)
    if visible is not None:
        per_head = expand_kv(visible.to(key.device), query.shape[1], dim=1)[:, :, None, :]
        if mask is None and q_len == 1:  # a decode step sees every cached slot: `visible` is the whole mask
            return per_head
    if mask is None:
        mask = causal_mask(q_len, n, key.device)[None, None]
    elif mask.dtype != torch.bool:
        mask = mask == 0  # additive float mask: 0 = attend
    mask = mask[..., :n]
    return mask if per_head is None else mask & per_head


def kvviz_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SDPA attention that reports to the active probe; transformers' eager attention when ``output_attentions``
    asks for the weights or the scores are soft-capped (``softcap``, which SDPA cannot apply). The arguments in the
    order of transformers' own attention functions (``dropout`` before ``scaling``): a wrapper that passes them on by
    position, as kvpress' attention patch does, reaches the right ones. Shapes as in transformers: query
    ``(B, H, q, D)``, key/value ``(B, KV, n, D)`` (the whole cache after this step's update); returns ``(B, q, H, D)``
    and the weights ``(B, H, q, n)`` or None."""
    probe = _probe.get()
    visible, layer = None, getattr(module, "kvviz_layer", module.layer_idx)  # a hybrid's KV layers are numbered apart
    if probe is not None and hasattr(module, "kv_b_proj"):  # latent attention: the probe sees what the cache holds
        stored = mla.stored()
        if stored is None:
            raise RuntimeError("a latent attention module that does not report its latent (kvviz.latent.install)")
        visible = probe.on_query(layer, mla.absorbed(module, query), *stored)
    elif probe is not None:
        visible = probe.on_query(layer, query, key, value)
        if query.shape[2] == 1:  # a decode step: a query-aware reader may pick what it reads
            chosen = probe.select(layer, query, key, _full_mask(attention_mask, query, key, visible))
            if chosen is not None:
                visible, attention_mask = chosen, None
    selection = kwargs.pop("indices", None)  # DSA: the indexer's scores (kvviz.sparse.install)
    if isinstance(selection, sparse.Selection):  # the slots this pass reads, chosen among the visible ones
        allowed = _full_mask(attention_mask, query, key, visible)[:, 0]  # (B, q, n): one latent head
        read = selection.read(allowed)
        extra = None if probe is None else probe.extra_reads(layer, key.shape[2])
        if extra is not None:  # e.g. blame putting an unread slot into the read set
            read[..., : extra.shape[-1]] |= extra.to(read.device) & allowed[..., : extra.shape[-1]]
        if probe is not None:
            probe.on_read(layer, read, selection.scores)
        visible, attention_mask = read[:, None].expand(-1, key.shape[1], -1, -1), None  # every row's whole mask
    elif selection is not None:
        raise RuntimeError("sparse indices from an indexer kvviz did not install (kvviz.sparse.install)")
    sinks = kwargs.pop("s_aux", None)  # gpt-oss passes its learned sinks under this name
    if sinks is not None:
        output, weights = _with_sinks(query, key, value, _full_mask(attention_mask, query, key, visible), scaling,
                                      sinks)
        weights = weights if kwargs.pop("output_attentions", False) else None
    elif kwargs.pop("output_attentions", False) or kwargs.get("softcap") is not None:
        allowed = _full_mask(attention_mask, query, key, visible)
        additive = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~allowed, torch.finfo(query.dtype).min
        )
        output, weights = eager_attention_forward(module, query, key, value, additive, dropout=dropout, scaling=scaling,
                                                 **kwargs)
    elif (visible is not None and (visible.dim() == 3 or visible.is_floating_point()) and query.shape[2] == 1
          and attention_mask is None):
        output, weights = _decode_step(query, key, value, visible, scaling), None
    elif visible is not None and visible.dim() == 4 and visible.dtype == torch.bool:
        output, weights = _grouped_rows(query, key, value, visible.to(key.device), scaling), None
    else:
        if visible is not None:
            attention_mask = _full_mask(attention_mask, query, key, visible)
        output, weights = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if probe is not None:
        probe.on_output(layer, output)
    return output, weights


def _with_sinks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor,
                scaling: float | None, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with a learned sink per query head (gpt-oss): the softmax over the ``allowed`` slots (bool
    ``(B, 1|H, q, n)``) and one more logit ``sinks`` ``(H,)`` with no value, so a row's weights sum to ``1 − α_sink``
    (:func:`~kvviz.attention_math.sink_softmax`, in float32). GQA per KV group, K/V never repeated. Query
    ``(B, H, q, D)`` → output ``(B, q, H, D)`` and weights ``(B, H, q, n)``."""
    batch, heads, rows, dim = query.shape
    groups, n = key.shape[1], key.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    s = (query.reshape(batch, groups, heads // groups * rows, dim) @ key.transpose(-1, -2)).view(batch, heads, rows, n)
    s = s.float().mul_(scale).masked_fill_(~allowed, float("-inf"))
    weights = sink_softmax(s, sinks[None]).to(value.dtype)
    output = weights.view(batch, groups, heads // groups * rows, n) @ value
    return output.view(batch, heads, rows, -1).transpose(1, 2).contiguous(), weights


def _decode_step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor,
                 scaling: float | None) -> torch.Tensor:
    """One decode step's SDPA with a per-KV-head ``visible`` ``(B, KV, n)`` (boolean or additive) or ``(B, KV, 1, n)``
    (additive): the ``H / KV`` query heads of a group are that group's query rows, so the mask broadcasts over them
    and K/V are never repeated per query head (transformers repeats them, two copies per layer, whenever a mask is
    given). Query ``(B, H, 1, D)`` → output ``(B, 1, H, D)``."""
    batch, heads, _, dim = query.shape
    groups = key.shape[1]
    mask = visible if visible.dim() == 4 else visible[:, :, None, :]
    output = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, groups, heads // groups, dim), key, value, attn_mask=mask, scale=scaling)
    return output.reshape(batch, 1, heads, -1)  # values may be narrower than queries (latent attention)


def _grouped_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor,
                  scaling: float | None) -> torch.Tensor:
    """SDPA with every query row's mask given whole, per KV head: ``visible`` bool ``(B, KV, q, n)`` (e.g. the
    variants of one step, each seeing itself only). As in :func:`_decode_step`, the query heads of a KV group become
    that group's rows, so K/V are never repeated per query head. Query ``(B, H, q, D)`` → output ``(B, q, H, D)``."""
    batch, heads, rows, dim = query.shape
    groups, n = key.shape[1], key.shape[2]
    share = heads // groups
    # additive before it is repeated per query head: SDPA would turn the repeated boolean mask into this itself
    additive = torch.zeros(visible.shape, dtype=query.dtype, device=query.device).masked_fill_(~visible, float("-inf"))
    mask = additive[:, :, None].expand(batch, groups, share, rows, n).reshape(batch, groups, share * rows, n)
    output = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, groups, share * rows, dim), key, value, attn_mask=mask, scale=scaling)
    return output.reshape(batch, heads, rows, -1).transpose(1, 2).contiguous()


def register() -> None:
    """Make ``attn_implementation="kvviz"`` available (idempotent; the registry is process-wide)."""
    AttentionInterface.register(ATTENTION_NAME, kvviz_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


class QueryLog:
    """Post-RoPE queries of every processed slot, all layers: ``(L, H, n, D)`` in a buffer grown by ~25 % steps.

    Writes of one forward pass are staged per layer and become visible with :meth:`commit`, so a failed pass leaves
    the log as it was. ``mixers``: for a hybrid model, the count and width of its recurrent layers, whose inputs per
    slot are kept beside the queries as :attr:`inputs` ``(M, 1, n, hidden)`` (:mod:`kvviz.recurrent`). ``reads``: for
    a model with sparse selection, how many slots a query reads (``index_topk``); the slots each one read are kept as
    :attr:`reads` ``(L, 1, n, topk)`` int64, −1 where a row read fewer (:mod:`kvviz.sparse`, :func:`read_mask`).
    """

    def __init__(self, layers: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 mixers: tuple[int, int] | None = None, reads: int | None = None):
        self.length, self.layers = 0, layers
        self._buffer = torch.empty(layers, heads, 0, head_dim, dtype=dtype, device=device)
        self.inputs = None if not mixers or not mixers[0] else QueryLog(mixers[0], 1, mixers[1], dtype, device)
        self.reads = None if not reads else QueryLog(layers, 1, reads, torch.int64, device)

    def _logs(self) -> list[QueryLog]:
        return [log for log in (self.inputs, self.reads) if log is not None]

    def reserve(self, size: int) -> None:
        """Capacity for ``size`` slots (grown by at least a quarter when it grows)."""
        capacity = self._buffer.shape[2]
        if size <= capacity:
            return
        layers, heads, _, head_dim = self._buffer.shape
        grown = self._buffer.new_empty(layers, heads, max(size, capacity + capacity // 4 + 64), head_dim)
        grown[:, :, : self.length] = self._buffer[:, :, : self.length]
        self._buffer = grown
        for log in self._logs():
            log.reserve(size)

    def write(self, layer: int, query: torch.Tensor) -> None:
        """Stage ``query`` ``(H, q, D)`` of ``layer`` right after the committed slots."""
        self.reserve(self.length + query.shape[1])
        self._buffer[layer, :, self.length : self.length + query.shape[1]] = query

    def commit(self, count: int) -> None:
        self.length += count
        for log in self._logs():
            log.commit(count)

    def rollback(self, length: int) -> None:
        """Forget the slots from ``length`` on (a pass that failed)."""
        self.length = length
        for log in self._logs():
            log.rollback(length)

    def __deepcopy__(self, memo: dict) -> QueryLog:
        """A copy holding the recorded queries, not the spare capacity (a forked run copies its session)."""
        copied = QueryLog.__new__(QueryLog)
        copied.length, copied.layers = self.length, self.layers
        copied._buffer = self._buffer[:, :, : self.length].clone()
        copied.inputs = None if self.inputs is None else self.inputs.__deepcopy__(memo)
        copied.reads = None if self.reads is None else self.reads.__deepcopy__(memo)
        return copied

    def layer(self, layer: int) -> torch.Tensor:
        """Queries of ``layer``: ``(H, n, D)`` (a view)."""
        return self._buffer[layer, :, : self.length]

    @property
    def nbytes(self) -> int:
        """Bytes held, including spare capacity (and the recurrent layers' inputs, the read sets)."""
        return self._buffer.numel() * self._buffer.element_size() + sum(log.nbytes for log in self._logs())


def read_mask(reads: torch.Tensor, n: int) -> torch.Tensor:
    """Recorded read sets ``(..., q, topk)`` (slot indices, −1 padding) → bool ``(..., q, n)``: True where read."""
    mask = torch.zeros(*reads.shape[:-1], n + 1, dtype=torch.bool, device=reads.device)
    return mask.scatter_(-1, torch.where((reads < 0) | (reads >= n), n, reads), True)[..., :n]


class QueryRecorder(Probe):
    """The session's probe: stores each layer's post-RoPE queries (batch row 0) in a :class:`QueryLog`, hides the
    slots a committed edit evicted (``evicted``: bool ``(L, KV, n)`` or None), tells ``on_layer(done, layers)``
    as each layer starts (a long prefill's progress) and lets ``selector`` pick what a decode step reads
    (:meth:`Probe.select`; a policy run's query-aware reader)."""

    def __init__(self, log: QueryLog, evicted: torch.Tensor | None = None,
                 on_layer: Callable[[int, int], None] | None = None, selector: Callable | None = None):
        self.log, self.evicted, self.on_layer, self.selector = log, evicted, on_layer, selector

    def on_query(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> torch.Tensor | None:
        self.log.write(layer, query[0])
        if self.on_layer is not None:
            self.on_layer(layer, self.log.layers)
        return None if self.evicted is None else ~self.evicted[layer][None]

    def on_mixer(self, index: int, hidden: torch.Tensor) -> None:
        self.log.inputs.write(index, hidden[:1])  # (1, q, hidden): batch row 0

    def select(self, layer, query, key, allowed):
        return None if self.selector is None else self.selector(layer, query, key, allowed)

    def on_read(self, layer: int, read: torch.Tensor, scores: torch.Tensor) -> None:
        self.log.reads.write(layer, read_slots(read[:1], self.log.reads._buffer.shape[-1]))


def read_slots(read: torch.Tensor, topk: int) -> torch.Tensor:
    """Bool read sets ``(..., q, n)`` → the slots read, ascending, ``(..., q, topk)`` int64 (−1 after the last)."""
    n = read.shape[-1]
    slots = torch.where(read, torch.arange(n, device=read.device), n).sort(dim=-1).values[..., :topk]
    if slots.shape[-1] < topk:
        slots = torch.nn.functional.pad(slots, (0, topk - slots.shape[-1]), value=n)
    return slots.masked_fill_(slots == n, -1)
