"""Decode steps of several sessions as one batched forward pass (docs/math.md §9).

Sessions whose caches hold the same number of slots — the full run and the policy runs of one prompt, forced on the
same reply or free on their own — process their pending tokens at the same position. Their caches become the rows of
shared per-layer buffers ``(B, KV, capacity, D)`` (each session's cache layers are views of its row, so nothing is
copied per step), one forward of ``B`` rows appends every row's slot, and each row hides its own evicted slots per
(layer, KV head) through the attention mask. A row's numbers are those of its session stepping alone, up to the
rounding of another batch shape (matrix-matrix instead of matrix-vector products).

:func:`drive` runs many step sequences written as generators (each round they yield a list of ``(row, token)``, a
session to step and the token to force or None, and receive the next-token logits of each), batching the requests of
each round by cache length.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import torch

from kvviz import kv_cache, recurrent
from kvviz.model import LoadedModel
from kvviz.recorder import Probe, QueryLog, probing
from kvviz.runs.compressed import CompressedSession
from kvviz.session import Session

Row = Session | CompressedSession
Request = tuple[Row, int | None]  # a session to step and the token to force (None: its own pending token)
Steps = Generator[list[Request], list[torch.Tensor], Any]


def drive(lm: LoadedModel, sequences: Sequence[Steps], batch: bool = True) -> list[Any]:
    """Run every generator of ``sequences`` to its end and return their values. Each round, every live generator
    yields the steps it takes in that round (a list of requests, e.g. a forced run and the free run forked from it)
    and receives their next-token logits, in the same order; those of batchable rows at equal cache length run as
    one pass (:func:`step_rows`; ``batch`` False: each alone), and the generators are resumed in the order of
    ``sequences``."""
    results: list[Any] = [None] * len(sequences)
    live: dict[int, list[Request]] = {}
    for index, steps in enumerate(sequences):
        _advance(steps, index, None, live, results)
    rows = _Rows()
    while live:
        groups: dict[tuple, list[tuple[int, int]]] = {}
        for index, requests in live.items():
            for place, (row, _) in enumerate(requests):
                session = _session(row)
                key = (len(session), session.transcript.next_position) if batch and _batchable(row) else (index, place)
                groups.setdefault(key, []).append((index, place))
        logits: dict[tuple[int, int], torch.Tensor] = {}
        for members in groups.values():
            requests = [live[index][place] for index, place in members]
            if len(members) == 1:
                logits[members[0]] = _step_alone(*requests[0])
            else:
                logits.update(zip(members, step_rows(lm, requests, rows)))
        rows.keep()
        for index in sorted(live):
            _advance(sequences[index], index, [logits[index, place] for place in range(len(live[index]))], live,
                     results)
    return results


def _advance(steps: Steps, index: int, logits: list[torch.Tensor] | None, live: dict, results: list) -> None:
    try:
        live[index] = next(steps) if logits is None else steps.send(logits)
    except StopIteration as done:
        live.pop(index, None)
        results[index] = done.value


def _step_alone(row: Row, token: int | None) -> torch.Tensor:
    if isinstance(row, CompressedSession):
        return row.step(token)
    _no_token(token)
    row.step()
    return row.logits


def _no_token(token: int | None) -> None:
    if token is not None:
        raise ValueError("only a policy run's session is forced to a token")


def _session(row: Row) -> Session:
    return row.session if isinstance(row, CompressedSession) else row


def _batchable(row: Row) -> bool:
    """A hybrid model's rows step alone: their recurrent layers' states are not rows of a shared buffer; so do a DSA
    model's, whose indexer keys are not either (:mod:`kvviz.sparse`)."""
    lm = _session(row).lm
    if recurrent.linear_layers(lm.config) or lm.attention.reads:
        return False
    return not isinstance(row, CompressedSession) or row.batchable


def step_rows(lm: LoadedModel, requests: Sequence[tuple[Row, int | None]], rows: _Rows | None = None
              ) -> list[torch.Tensor]:
    """One decode step of every ``(row, token)`` (rows of equal length, all batchable) as one forward pass; returns
    each row's next-token logits ``(V,)`` float32, as ``row.step(token)`` would. ``rows``: the buffers of the last
    batches, reused while the same sessions step together."""
    for row, token in requests:
        if not isinstance(row, CompressedSession):
            _no_token(token)
    first = _session(requests[0][0])
    length, position = len(first), first.transcript.next_position
    if any(len(_session(row)) != length or _session(row).transcript.next_position != position for row, _ in requests):
        raise ValueError("a batched step needs sessions of equal length and position")
    sessions = [row.begin_step(token) if isinstance(row, CompressedSession) else row for row, token in requests]
    for session in sessions:
        session.check_step()
    buffers, views = (rows or _Rows()).joined(sessions, length + 1)
    hidden = [session.commits.evicted(length + 1) for session in sessions]  # (L, KV, n + 1) each, or None
    shown = [mask for mask in hidden if mask is not None]
    visible = None if not shown else ~torch.stack(
        [mask if mask is not None else torch.zeros_like(shown[0]) for mask in hidden], 1)  # (L, B, KV, n + 1)
    for session in sessions:
        session.queries.reserve(session.queries.length + 1)
    device = lm.device
    with torch.no_grad(), probing(_RowsProbe([s.queries for s in sessions], visible)):
        out = lm.model(input_ids=torch.tensor([[s.pending] for s in sessions], device=device),
                       position_ids=torch.full((len(sessions), 1), position, device=device),
                       cache=kv_cache.over(buffers, length, views), use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1].float()
    kv_cache.extend([session.cache for session in sessions], buffers, length + 1)
    for index, session in enumerate(sessions):
        session.queries.commit(1)
        session.end_step(logits[index].clone())  # not a view keeping the batch's logits
    return [row.end_step() if isinstance(row, CompressedSession) else row.logits for row, _ in requests]


class _RowsProbe(Probe):
    """Records each row's query in its session's :class:`QueryLog` and hides each row's evicted slots: ``visible``
    bool ``(L, B, KV, n)`` or None."""

    def __init__(self, logs: list[QueryLog], visible: torch.Tensor | None):
        self.logs, self.visible = logs, visible

    def on_query(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor | None:
        for row, log in enumerate(self.logs):
            log.write(layer, query[row])
        return None if self.visible is None else self.visible[layer].to(key.device)


class _Rows:
    """The shared buffers of the batches in use: ``(sessions' ids) → per-layer (keys, values) (B, KV, capacity, D)``
    (:func:`kvviz.kv_cache.share`). A batch is made again (its rows copied once) when its sessions change or outgrow
    it."""

    def __init__(self):
        self.batches: dict[tuple[int, ...], list[kv_cache.KV]] = {}
        self.used: list[tuple[int, ...]] = []

    def joined(self, sessions: list[Session], need: int) -> tuple[list[kv_cache.KV], list[kv_cache.KV]]:
        """The buffers holding ``sessions``' caches as their rows (each session's layers then views of its row),
        with room for ``need`` slots; and the views of the cached slots."""
        key = tuple(id(session) for session in sessions)
        self.used.append(key)
        caches, length = [session.cache for session in sessions], need - 1
        buffers = self.batches.get(key)
        if buffers is None or buffers[0][0].shape[2] < need or not kv_cache.shared(caches, buffers):
            buffers = self.batches[key] = kv_cache.share(caches, length, need + max(need // 4, 64))
        return buffers, kv_cache.leading(buffers, length)

    def keep(self) -> None:
        """End of a round: keep the buffers of the batches this round used (the others' sessions moved on)."""
        self.batches = {key: self.batches[key] for key in self.used if key in self.batches}
        self.used = []
