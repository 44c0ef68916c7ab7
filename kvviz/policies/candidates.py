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
        """Cached keys (post-RoPE) of ``layer``: ``(KV, at, D)``."""
        return self.session.layer_kv(layer)[0][:, : self.at]

    def values(self, layer: int) -> torch.Tensor:
        """Cached values of ``layer``: ``(KV, at, D)``."""
        return self.session.layer_kv(layer)[1][:, : self.at]

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
        return self.session.lm.model.model.layers[layer].self_attn

    def position_embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary ``(cos, sin)`` of the candidates' positions, ``(1, at, D)`` each, as the model computed them."""
        lm = self.session.lm
        positions = torch.tensor([[s.position for s in self.session.transcript.slots[: self.at]]], device=lm.device)
        return lm.model.model.rotary_emb(self.hidden_states(0)[None], positions)

    def accumulated(self) -> torch.Tensor:
        """Attention each candidate received from every query so far: ``(L, KV, at)`` (H2O's heavy hitters)."""
        return self.running if self.running is not None else self.attention(slice(0, self.at))


def received_attention(session: Session, at: int, rows: slice, chunk: int = 256) -> torch.Tensor:
    """Attention each slot ``0..at-1`` received from the query slots ``rows`` (all before ``at``), summed over those
    queries and over the query heads of each KV group: ``(L, KV, at)``."""
    lm = session.lm
    start, stop = rows.start, rows.stop
    total = torch.zeros(lm.layers, lm.heads, at)
    for layer in range(lm.layers):
        for first in range(start, stop, chunk):
            weights = session.weights(layer, first, min(stop, first + chunk))  # (H, rows, ≤ at)
            total[layer, :, : weights.shape[-1]] += weights.sum(1).cpu()
    return total.reshape(lm.layers, lm.kv_heads, lm.heads // lm.kv_heads, at).sum(2)
