"""kvpress' cache as kvpress' own generation holds it, for presses that act while decoding (their own
``forward_hook``: ``DecodingPress`` over any scorer, ``PrefillDecodingPress``, ``DMSPress(decoding=True)``, …).

Such a press keeps state between steps (buffered hidden states, step counts, masked indices) and rewrites its cache in
its own order (``topk``'s). kvviz keeps its cache in slot order and evicts with masks, so a run keeps a *mirror*: a
transformers ``DynamicCache`` holding exactly what kvpress' cache would hold, and beside it the slot each row is. At each
decision the slots processed since the last one are appended to the mirror (as the model's forward appends them), the
press's hook runs once per layer with what kvpress' hook receives — the new slots' attention inputs ``(1, q, hidden)``,
their rotary ``position_embeddings``, ``cache_position`` counted from the mirror's length as the model counts it, the
mirror as ``past_key_values`` — and the rows left in the mirror, less ``masked_key_indices``, are the slots kept (a layer whose tensors the hook left
as they were — the same storage and shape — is taken as unchanged; a hook that writes into them in place is not seen).
Attention is the same over a cache in any order, so the run's next tokens are kvpress' (up to float32 summation order).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates


@dataclass
class Mirror:
    """One run's mirror of kvpress' cache: the press (a copy, with its state), the cache, per layer the slot of each
    row ``(KV, m)`` and the masked indices the press left on the module."""

    press: object
    cache: DynamicCache = field(default_factory=DynamicCache)
    slots: list[torch.Tensor] = field(default_factory=list)
    masked: dict[int, object] = field(default_factory=dict)
    seen: int = 0  # slots appended so far


def mirror_of(candidates: Candidates, press: object) -> Mirror:
    """The run's mirror (made at its first decision, with a copy of ``press``)."""
    if candidates.scratch is None:
        raise KvvizError(f"kvpress' {type(press).__name__} acts while decoding, step by step: run it as a policy run "
                         "(mode decode), not as a one-shot what-if")
    return candidates.scratch.setdefault("kvpress_mirror", Mirror(copy.deepcopy(press)))


def advance(mirror: Mirror, candidates: Candidates, hidden, rotary) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the slots ``mirror.seen..at-1`` and run the press's hook on every layer. Returns the kept slots
    ``(L, KV, at)`` bool and the scores ``(L, KV, at)`` (kept 1, evicted 0)."""
    session, at = candidates.session, candidates.at
    lm, new = session.lm, slice(mirror.seen, at)
    if new.start >= new.stop:
        raise KvvizError("a decoding press decides once per new slot; nothing was processed since its last decision")
    positions = torch.tensor([[s.position for s in session.transcript.slots[new]]], device=lm.device)
    press = mirror.press
    if mirror.seen == 0 and callable(getattr(press, "post_init_from_model", None)):
        press.post_init_from_model(lm.model)
    kept = torch.zeros(lm.layers, lm.kv_heads, at, dtype=torch.bool)
    for layer in range(lm.layers):
        module = candidates.module(layer)
        index = module.layer_idx  # the press reads the cache by decoder layer (a hybrid's differ from kvviz's)
        before = mirror.cache.layers[index].keys.shape[-2] if index < len(mirror.cache.layers) else 0
        keys, values = candidates.keys(layer)[:, new][None], candidates.values(layer)[:, new][None]
        mirror.cache.update(keys, values, index)
        ids = torch.arange(new.start, new.stop).expand(lm.kv_heads, -1)
        slots = torch.cat([mirror.slots[layer], ids], -1) if layer < len(mirror.slots) else ids
        old_keys, old_values = mirror.cache.layers[index].keys[0], mirror.cache.layers[index].values[0]
        inputs = hidden.layer(layer)[new][None]
        kwargs = {"hidden_states": inputs, "position_embeddings": rotary(inputs, positions), "attention_mask": None,
                  "past_key_values": mirror.cache, "position_ids": positions,
                  "cache_position": torch.arange(before, before + inputs.shape[1], device=lm.device)}
        with hook_ready(module, lm.model.model.rotary_emb, mirror.masked.get(layer)), torch.no_grad():
            press.forward_hook(module, [], kwargs, (None, None))
            mirror.masked[layer] = module.masked_key_indices
        left = mirror.cache.layers[index]
        if left.keys.data_ptr() != old_keys.data_ptr() or left.values.data_ptr() != old_values.data_ptr() \
                or left.keys.shape != old_keys[None].shape or left.values.shape != old_values[None].shape:
            rows = matched(type(press).__name__, old_keys, old_values, left.keys[0], left.values[0])
            slots = slots.gather(-1, rows)  # the press rewrote the layer's cache: which rows are left, in its order
        if len(mirror.slots) <= layer:
            mirror.slots.append(slots)
        mirror.slots[layer] = slots
        kept[layer].scatter_(-1, slots.cpu(), True)
        masked = mirror.masked[layer]
        if masked is not None:
            _, heads, rows_masked = masked
            kept[layer][heads.cpu(), slots.cpu()[heads.cpu(), rows_masked.cpu()]] = False
    mirror.seen = at
    return kept, kept.float()


@contextmanager
def hook_ready(module: torch.nn.Module, rotary_emb: torch.nn.Module, masked: object = None) -> Iterator[None]:
    """``module`` as kvpress' hook finds it for one call: the model's ``rotary_emb`` attached (kvpress' ``__call__``
    attaches it) and ``masked_key_indices`` set to ``masked``; afterwards the module's own ``rotary_emb`` is back and
    the masked indices are cleared (kvviz evicts with masks of its own, never through them)."""
    previous = getattr(module, "rotary_emb", None)
    module.masked_key_indices = masked
    module.rotary_emb = rotary_emb
    try:
        yield
    finally:
        if previous is None:
            del module.rotary_emb
        else:
            module.rotary_emb = previous
        module.masked_key_indices = None


def matched(name: str, keys: torch.Tensor, values: torch.Tensor, out_keys: torch.Tensor,
            out_values: torch.Tensor) -> torch.Tensor:
    """For each row a press returned, ``out_keys`` / ``out_values`` ``(KV, n, D)``, the row of ``keys`` / ``values``
    ``(KV, at, D)`` it is: ``(KV, n)`` indices. Rows are found by a fingerprint (a fixed random projection, sorted
    of the rows' bits in integers: exact in any summation order, sorted and searched) and then checked equal, element
    for element; a returned row that is no input row is refused."""
    if not isinstance(out_keys, torch.Tensor) or out_keys.dim() != 3 or out_keys.shape[0] != keys.shape[0] \
            or out_keys.shape[2] != keys.shape[2] or not isinstance(out_values, torch.Tensor) \
            or out_values.shape != out_keys.shape:
        raise KvvizError(f"kvpress' {name} left keys of shape {tuple(getattr(out_keys, 'shape', ()))} for "
                         f"{tuple(keys.shape)}: kvviz reads a press that changes the cache's shape this way no further")
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randint(1, 2 ** 20, (t.shape[-1],), generator=generator).to(t.device) for t in (keys, values)]
    print_in = _bits(keys) @ weights[0] + _bits(values) @ weights[1]  # (KV, at)
    print_out = _bits(out_keys) @ weights[0] + _bits(out_values) @ weights[1]  # (KV, n)
    order = print_in.argsort(-1)
    place = torch.searchsorted(print_in.gather(-1, order), print_out).clamp(max=keys.shape[1] - 1)
    rows = order.gather(-1, place)  # (KV, n)
    index = rows[..., None].expand(-1, -1, keys.shape[-1])
    same = (keys.gather(1, index) == out_keys).all(-1) & (values.gather(1, index) == out_values).all(-1)
    if not bool(same.all()):
        raise KvvizError(
            f"kvpress' {name} changes the cache's contents ({int((~same).sum())} of {same.numel()} returned rows are no "
            "cached slot's key and value): kvviz runs presses that choose slots; ThinK's pruned channels and "
            "MergingPress' merged values are kvviz edits (whatif --think R, whatif --policy … --merge)")
    if any(len(set(head.tolist())) != len(head) for head in rows):
        raise KvvizError(f"kvpress' {name} returned one cached slot twice")
    return rows


def _bits(rows: torch.Tensor) -> torch.Tensor:
    """The rows' bit patterns as int64 ``(..., D)`` (float32 → its 32 bits, 16-bit floats → their 16): a projection
    of them by integers under 2^20 cannot overflow and sums exactly in any order."""
    rows = rows.contiguous() if rows.element_size() in (2, 4) else rows.float().contiguous()
    return rows.view(torch.int32 if rows.element_size() == 4 else torch.int16).long()
