"""Attention weights recomputed on demand from a session's recorded post-RoPE queries and its cached keys (docs/math.md
§2): no attention map is ever stored. Each row sees the keys as they were when its slot was processed — the original
keys with the edit committed at that time (quantized keys, evicted slots hidden)."""

from __future__ import annotations

import torch

from kvviz.attention_math import kv_head_of
from kvviz.attention_support import AttentionRule
from kvviz.edit.commits import Commits
from kvviz.errors import KvvizError
from kvviz.geometry import Geometry
from kvviz.recorder import QueryLog, read_mask


def recorded_weights(commits: Commits, queries: QueryLog, shape: Geometry, rule: AttentionRule, layer: int,
                     start: int = 0, stop: int | None = None, head: int | None = None) -> torch.Tensor:
    """Attention weights of the slots ``start..stop-1`` as queries: ``(H, stop - start, stop)`` float32, or
    ``(1, stop - start, stop)`` for one query ``head``.

    Recomputed from the recorded post-RoPE queries and the keys each slot saw when it was processed (the original
    keys with the edit committed at that time): row ``i`` sees slots ``0..start+i`` (within the layer's sliding
    window) except evicted ones; with sparse selection, those its step read (:mod:`kvviz.sparse`). ``commits`` and ``queries`` are a session's; ``shape`` and ``rule`` its model's.
    """
    cached = queries.length
    stop = cached if stop is None else stop
    if not 0 <= start < stop <= cached:
        raise KvvizError(f"slots {start}..{stop - 1} are not all cached (the cache holds {cached})")
    reads = None if queries.reads is None else queries.reads.layer(layer)[0]  # (n, topk): the slots each row read
    queries = queries.layer(layer)
    kv_head = None
    if head is not None:  # one query head and the KV head it reads
        kv_head = kv_head_of(head, shape.heads, shape.kv_heads)
        queries = queries[head : head + 1]
    cuts = sorted({start, stop, *(b for b in commits.boundaries() if start < b < stop)})
    segments = list(zip(cuts, cuts[1:]))
    groups: list[list[tuple[int, int]]] = []  # consecutive segments that saw the same keys
    for segment in segments:
        if groups and commits.key_version(groups[-1][0][0]) == commits.key_version(segment[0]):
            groups[-1].append(segment)
        else:
            groups.append([segment])
    rows = []
    for group in groups:
        first, end = group[0][0], group[-1][1]
        keys = commits.keys_at(layer, first, end)  # (KV, end, D)
        if rule.latent is not None:  # the latent and the RoPE key, each as the step saw it
            keys = rule.keyed(keys, commits.values_at(layer, first, end))
        evicted = None  # nothing hidden while no commit in force evicts or merges
        if any(commits.edit_at(a).evicted_slots() for a, _ in group):
            evicted = torch.cat([commits.hidden(a, end)[layer, :, None, :].expand(-1, b - a, -1) for a, b in group],
                                dim=1).to(keys.device)
        if reads is not None:  # a slot a row did not read is hidden from it as an evicted one is
            unread = ~read_mask(reads[first:end], end)[None]  # (1, end - first, end)
            evicted = unread if evicted is None else evicted | unread
        if kv_head is not None:
            keys = keys[kv_head : kv_head + 1]
            evicted = None if evicted is None else evicted[kv_head : kv_head + 1]
        part = rule.weights(queries[:, first:end], keys, layer, evicted, head=head)  # (H, end - first, end)
        rows.append(part if end == stop else torch.nn.functional.pad(part, (0, stop - end)))
    return rows[0] if len(rows) == 1 else torch.cat(rows, dim=1)  # one group: its rows, not a copy
