"""One forward pass of new tokens on a session's cache, long ones in chunks (docs/math.md §1).

A chunk of ``c`` query rows attends to every cached slot plus its own causal triangle, so prefilling ``q`` tokens
as ``ceil(q / CHUNK)`` passes gives the same K/V, recorded queries and last logits as one pass (up to float
rounding; tested ≤ 1e-4 on the logits). Chunks keep a long message's progress moving and let another session's
work interleave between them. Every pass is atomic: if any chunk fails (or the caller stops it from the progress
callback), the cache and the recorded queries are cut back to where they were.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvviz import kv_cache, recurrent
from kvviz.model import LoadedModel
from kvviz.recorder import QueryLog, QueryRecorder, probing

CHUNK = 1024  # tokens per pass of a long prefill


def chunks(count: int, size: int = CHUNK) -> list[range]:
    """``range(count)`` cut into consecutive parts of at most ``size`` (one part when it fits)."""
    return [range(start, min(start + size, count)) for start in range(0, count, max(int(size), 1))]


def forward(lm: LoadedModel, cache, queries: QueryLog, evicted: Callable[[int], torch.Tensor], ids: list[int],
            position: int, on_layer: Callable[[int, int], None] | None = None, chunk: int = CHUNK,
            selector: Callable | None = None) -> torch.Tensor:
    """Append the K/V and recorded queries of ``ids`` (at positions ``position..``) to ``cache`` / ``queries``,
    with the committed edits' evictions hidden — ``evicted(n)``: the slots a pass ending at slot ``n`` hides, as the
    session's commit log answers it (``Commits.evicted``); returns the last token's next-token logits ``(V,)`` float32.

    ``on_layer(done, total)`` is told as each layer of each chunk starts (``total`` = layers × chunks);
    ``selector`` picks what a decode step reads (:meth:`kvviz.recorder.Probe.select`).
    """
    length, recorded = cache.get_seq_length(), queries.length
    parts = chunks(len(ids), chunk)
    queries.reserve(recorded + len(ids))
    states = recurrent.snapshot(cache)  # a hybrid model's recurrent layers, which a pass changes in place
    try:
        for index, part in enumerate(parts):
            report = None if on_layer is None else _progress(on_layer, index, len(parts))
            probe = QueryRecorder(queries, evicted(length + part.stop), report, selector)
            start = position + part.start
            with torch.no_grad(), probing(probe):
                out = lm.model(
                    input_ids=torch.tensor([ids[part.start:part.stop]], device=lm.device),
                    position_ids=torch.arange(start, start + len(part), device=lm.device)[None],
                    cache=cache, use_cache=True, logits_to_keep=1,
                )
            queries.commit(len(part))
            if len(parts) > 1:
                kv_cache.reserve(cache, length + len(ids))
    except BaseException:
        kv_cache.truncate(cache, length)  # undo the layers and chunks that were already appended
        recurrent.place(cache, states)
        queries.rollback(recorded)
        raise
    return out.logits[0, -1].float()


def _progress(on_layer: Callable[[int, int], None], index: int, count: int) -> Callable[[int, int], None]:
    return lambda layer, layers: on_layer(index * layers + layer, count * layers)
