"""One decode step re-run as B variants in one batched forward pass, each with its own mask (docs/math.md §9).

The step's token is fed once per variant, at its true position, on a cache holding at least the slots before it (the
session's own, lent: the variants' slots are written into its spare room and cut off afterwards), and a probe gives
every variant its own mask: which of the slots before the step it sees, none of the slots between them and the new
ones, and of the new slots only its own. Blame ranks restores this way; the comparison of policies at a step runs
each policy's eviction this way.
"""

from __future__ import annotations

import torch
from transformers import Cache

from kvviz import kv_cache, recurrent
from kvviz.recorder import Probe, probing
from kvviz.session import Session


class Variants(Probe):
    """Gives variant ``i`` the mask ``visible[i]`` over the cache's first ``at`` slots, none of the slots between
    them and the new ones, and of the new slots only its own; with sparse selection, ``reads[i]`` ``(L, at)`` are
    slots it reads besides those its indexer picks (of the visible ones)."""

    def __init__(self, visible: torch.Tensor, reads: torch.Tensor | None = None):
        self.visible, self.reads = visible, reads  # (B, L, KV, at), (B, L, at)

    def extra_reads(self, layer, n):
        return None if self.reads is None else self.reads[None, :, layer]  # (1, B, at)

    def on_query(self, layer, query, key, value):
        batch, _, kv, at = self.visible.shape
        mask = torch.zeros(kv, batch, key.shape[2], dtype=torch.bool, device=key.device)
        mask[:, :, :at] = self.visible[:, layer].to(key.device).transpose(0, 1)
        mask[:, :, key.shape[2] - batch :] = torch.eye(batch, dtype=torch.bool, device=key.device)
        return mask[None]  # (1, KV, B, n + B)


def rerun(session: Session, at: int, visible: torch.Tensor, cache: Cache | None = None,
          reads: torch.Tensor | None = None) -> torch.Tensor:
    """The step of slot ``at`` once per variant, ``visible`` bool ``(B, L, KV, at)`` the slots before it each sees
    (within the model's sliding windows: the variants' masks replace the model's own), in one pass on ``cache``
    (default: the session's own, lent and cut back afterwards); with sparse selection, ``reads`` ``(B, L, at)`` the
    slots each reads besides its indexer's picks. Returns the logits ``(B, V)`` float32."""
    return rerun_rows(session, [at] * len(visible), visible, cache, reads)


def rerun_rows(session: Session, slots: list[int], visible: torch.Tensor, cache: Cache | None = None,
               reads: torch.Tensor | None = None) -> torch.Tensor:
    """The steps of ``slots`` (B of them, repeats allowed) in one pass: row ``i`` feeds slot ``slots[i]``'s token at
    its position and sees the cached slots ``visible[i]`` (bool ``(B, L, KV, m)`` over the cache's first ``m``,
    within the model's sliding windows as that step had them) and its own new slot (with sparse selection, reads
    ``reads[i]`` ``(L, m)`` besides its indexer's picks). Returns the logits ``(B, V)`` float32."""
    lm, batch, length, at = session.lm, len(visible), len(session), visible.shape[-1]
    picked = [session.transcript.slots[slot] for slot in slots]
    outside = torch.stack([lm.attention.outside(slot, at, visible.device) for slot in slots])  # (B, L, m)
    visible = visible & ~outside[:, :, None]
    cache = session.cache if cache is None else cache
    if recurrent.linear_layers(lm.config):
        return torch.cat([_alone(session, slot, row[None], cache) for slot, row in zip(slots, visible)])
    try:
        with torch.no_grad(), probing(Variants(visible, reads)):
            out = lm.model(input_ids=torch.tensor([[s.id for s in picked]], device=lm.device),
                           position_ids=torch.tensor([[s.position for s in picked]], device=lm.device),
                           cache=cache, use_cache=True, logits_to_keep=batch)
    finally:
        if cache is session.cache:
            kv_cache.truncate(session.cache, length)
    return out.logits[0].float()


def _alone(session: Session, index: int, visible: torch.Tensor, cache: Cache) -> torch.Tensor:
    """One row of :func:`rerun_rows` on a hybrid model, in a pass of its own (its recurrent layers would read the rows
    of one pass as consecutive tokens): the step of slot ``index`` on ``cache``, whose recurrent layers start from
    their states before that slot; ``cache`` is as it was afterwards. Returns the logits ``(1, V)`` float32."""
    lm, length, slot = session.lm, cache.get_seq_length(), session.transcript.slots[index]
    mine = recurrent.layers(states_before(session, index))
    kept = {layer: cache.layers[layer] for layer in mine}
    try:
        recurrent.place(cache, mine)
        with torch.no_grad(), probing(Variants(visible)):
            out = lm.model(input_ids=torch.tensor([[slot.id]], device=lm.device),
                           position_ids=torch.tensor([[slot.position]], device=lm.device),
                           cache=cache, use_cache=True, logits_to_keep=1)
    finally:
        recurrent.place(cache, kept)
        kv_cache.truncate(cache, length)
    return out.logits[0].float()


def states_before(session: Session, at: int) -> dict:
    """A hybrid model's recurrent layers as they stood before slot ``at`` (:mod:`kvviz.recurrent`; empty without
    any): copies of the live cache's before the pending slot, else rebuilt from the recorded inputs (memoized)."""
    if not recurrent.linear_layers(session.lm.config):
        return {}
    if at == len(session):
        return {index: None if state is None else tuple(t.clone() for t in state)
                for index, state in recurrent.live_states(session.cache).items()}
    return session.memoized("recurrent", at, lambda: recurrent.states_at(session.lm.model, session.queries.inputs, at),
                            keep=4)
