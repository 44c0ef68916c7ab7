"""What a policy sees when it decides: the cache as it stands, the recorded queries and attention, the attention
layers' inputs where a run recorded them — like the arguments of kvpress' ``ScorerPress.score``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.hidden_log import HiddenLog
from kvviz.session import Session


@dataclass
class Candidates:
    """What a policy sees when it decides which of the slots ``0..at-1`` to keep: the cache as it stands (quantized
    where the run quantized it), the recorded queries and the attention each slot received, nothing after ``at``."""

    session: Session
    at: int  # slots 0..at-1 are candidates; ``at`` is the slot about to be processed
    keep: int  # slots to keep per layer and KV head (on average, for uneven budgets)
    alive: torch.Tensor  # (L, KV, at) bool: not evicted earlier (a run's evictions are final), within the window
    running: torch.Tensor | None = None  # (L, KV, at) attention received so far, kept up to date by a policy run
    share: float | None = None  # the kept share of a fractional budget (kvpress' PyramidKV schedule follows it);
    # under a Ratio budget, the Ratio itself (its ``ratio``: kvpress' compression_ratio)
    hidden: HiddenLog | None = None  # the attention layers' inputs, recorded by runs of policies that read them
    scratch: dict | None = None  # what a policy keeps between one run's decisions (None: a one-shot decision)

    def keys(self, layer: int) -> torch.Tensor:
        """Cached keys (post-RoPE) of ``layer``: ``(KV, at, D)``; with latent attention what the recorded queries
        score against, the latent and the RoPE key side by side (:meth:`AttentionRule.keyed`)."""
        return self.session.lm.attention.keyed(*self.session.layer_kv(layer))[:, : self.at]

    def values(self, layer: int) -> torch.Tensor:
        """Cached values of ``layer``: ``(KV, at, D)``; with latent attention the latent the weights average
        (:meth:`AttentionRule.carried`)."""
        return self.session.lm.attention.carried(*self.session.layer_kv(layer))[:, : self.at]

    def queries(self, layer: int, rows: slice) -> torch.Tensor:
        """Recorded post-RoPE queries of the slots ``rows`` (all before ``at``): ``(H, len(rows), D)``."""
        return self.session.queries.layer(layer)[:, rows]

    def attention(self, rows: slice) -> torch.Tensor:
        """Attention the candidates received from the query slots ``rows``, as those steps computed it (on the cache
        as it stood then), summed over the rows and the query heads of each KV group: ``(L, KV, at)`` (a copy of
        what the session keeps for its cache version: policies deciding again at the same step sum nothing again)."""
        return self.session.memoized("received_attention", (self.at, rows.start, rows.stop),
                                     lambda: received_attention(self.session, self.at, rows), keep=4).clone()

    def hidden_states(self, layer: int) -> torch.Tensor:
        """The input hidden states of ``layer``'s attention for the candidates: ``(at, hidden)`` (kvpress'
        ``hidden_states``). Recorded only in policy runs of policies with ``reads_hidden``."""
        if self.hidden is None:
            raise KvvizError("this policy reads the attention layers' input hidden states, which kvviz records in "
                             "policy runs only: run it as a policy run (prefill mode for a kvpress press)")
        return self.hidden.layer(layer)[: self.at]

    def module(self, layer: int) -> torch.nn.Module:
        """``layer``'s attention module (its ``q_proj``, ``head_dim``, config: what kvpress' scorers use)."""
        return self.session.lm.attention_modules[layer]

    def positions(self) -> torch.Tensor:
        """The candidates' positions ``(1, at)`` (kvpress' ``position_ids``), on the model's device."""
        return torch.tensor([[s.position for s in self.session.transcript.slots[: self.at]]],
                            device=self.session.lm.device)

    def position_embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary ``(cos, sin)`` of the candidates' positions, ``(1, at, D)`` each, as the model computed them
        (the rotary module reads only the device and dtype of its first argument: the cached keys')."""
        return self.session.lm.model.model.rotary_emb(self.keys(0)[None], self.positions())

    def accumulated(self) -> torch.Tensor:
        """Attention each candidate received from every query so far: ``(L, KV, at)`` (H2O's heavy hitters)."""
        return self.running if self.running is not None else self.attention(slice(0, self.at))


@dataclass(frozen=True)
class _Received:
    """Attention received from the query rows ``0..rows-1``, whole chunks of ``chunk`` rows, per query head:
    ``total`` ``(L, H, rows)``, as it stood under the committed edits ``commits`` (those made before row ``rows``)."""

    rows: int
    chunk: int
    commits: tuple
    total: torch.Tensor


def received_attention(session: Session, at: int, rows: slice, chunk: int = 64) -> torch.Tensor:
    """Attention each slot ``0..at-1`` received from the query slots ``rows`` (all before ``at``), summed over those
    queries and over the query heads of each KV group: ``(L, KV, at)``.

    Summed per layer chunk by chunk (``chunk`` rows each). From the first row, the sum over the whole chunks is kept
    in the session (:attr:`~kvviz.memo.Memo.lasting`) and a later call with more rows adds only the chunks after
    it: a decision at the next step sums ≤ ``chunk`` + 1 rows again, not all of them, and the result is the very
    same (the same chunks added in the same order). It is used while the commits made before its last row are the
    same ones: a later commit hides or quantizes only for later rows; an undo of an earlier one, or a policy run
    rewriting its session (which clears the memo), starts again from the first row."""
    lm = session.lm
    start, stop = rows.start, rows.stop
    total = torch.zeros(lm.layers, lm.heads, at)
    first, kept = start, None
    if start == 0:
        kept = session.memo.lasting.get("received_attention")
        if kept is not None and not (kept.chunk == chunk and _same(kept.commits, session, kept.rows)):
            kept = None  # no longer what its rows see
        if kept is not None and kept.rows <= stop:
            total[:, :, : kept.rows] = kept.total
            first = kept.rows
    whole = stop - (stop - start) % chunk if start == 0 else first  # rows in whole chunks from the first row
    longer = whole > first and (kept is None or whole > kept.rows)  # a look back keeps the longer sum kept
    snapshot = torch.empty(lm.layers, lm.heads, whole) if longer else None
    for layer in range(lm.layers):
        for row in range(first, stop, chunk):
            if snapshot is not None and row == whole:
                snapshot[layer] = total[layer, :, :whole]
            weights = session.weights(layer, row, min(stop, row + chunk))  # (H, rows, ≤ at)
            total[layer, :, : weights.shape[-1]] += weights.sum(1).cpu()
        if snapshot is not None and whole == stop:
            snapshot[layer] = total[layer, :, :whole]
    if snapshot is not None:
        session.memo.lasting["received_attention"] = _Received(whole, chunk, _commits(session, whole), snapshot)
    return total.reshape(lm.layers, lm.kv_heads, lm.heads // lm.kv_heads, at).sum(2)


def _commits(session: Session, rows: int) -> tuple:
    """The committed edits in force for some of the rows ``0..rows-1`` (made before row ``rows``)."""
    return tuple(commit for commit in session.commits.stack if commit.at < rows)


def _same(kept: tuple, session: Session, rows: int) -> bool:
    now = _commits(session, rows)
    return len(now) == len(kept) and all(a is b for a, b in zip(now, kept))
