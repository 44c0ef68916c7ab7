"""ChunkKV — Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM Inference"
(2025, arXiv:2502.00299).

A wrapper: another policy (``inner``, by name — a kvviz policy with its defaults, or a kvpress press as
``kvpress:NAME`` with kvpress' conventions) scores the candidates; per layer, the scores are summed over the KV heads and averaged over chunks of
``chunk`` consecutive candidates (the last chunk shorter), and whole chunks are kept, the best first —
``max(1, int(chunks · kept share))`` of them, the same in every KV head of the layer, as kvpress' ``ChunkKVPress``
keeps them (``torch.topk`` among equal chunk scores). Protected slots of the inner policy (``+inf``) score one above
the layer's highest finite score. A slot's score in the decision is its chunk's. In a decode-mode run the chunks are
those of the slots the layer still holds. With fewer candidates than one chunk, the inner policy decides alone (as
kvpress does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, Policy, checked_choices, checked_scores, choice, keep_rank
from kvviz.policies.inner import inner_policy
from kvviz.policies.decision import Decision


@dataclass(frozen=True)
class ChunkKV(Policy):
    name = "chunk_kv"

    inner: str = choice("key_norm", "key_diff", "snapkv", "h2o", "tova", "streaming_llm", "lag_kv", "observed_attention",
                        "random", "cur", "kvpress:KnormPress", "kvpress:KeyDiffPress", "kvpress:CURPress",
                        "kvpress:SnapKVPress")  # the scorer
    chunk: int = 20  # slots per chunk

    def __post_init__(self) -> None:
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise KvvizError(f"chunk_kv's chunk must be a positive integer, got {self.chunk!r}")
        checked_choices(self)

    def scorer(self) -> Policy:
        """The inner policy."""
        return inner_policy(self.inner)

    def score(self, candidates: Candidates) -> torch.Tensor:
        return self.decide(candidates).scores

    def decide(self, candidates: Candidates) -> Decision:
        alive = candidates.alive.all(1)  # (L, at): chunks are whole in every KV head
        if int(alive.sum(-1).max()) < self.chunk:  # not one whole chunk: the inner policy alone (as kvpress)
            return self.scorer().decide(candidates)
        scores = checked_scores(self.scorer(), candidates)  # (L, KV, at)
        layers, heads, at = scores.shape
        share = candidates.share if candidates.share is not None else candidates.keep / max(at, 1)
        chunked = torch.full((layers, at), float("-inf"))
        kept = torch.zeros(layers, at, dtype=torch.bool)
        for layer in range(layers):
            slots = alive[layer].nonzero()[:, 0]
            if len(slots) == 0:
                continue
            own = scores[layer][:, slots]  # (KV, n)
            finite = own[own.isfinite()]
            top = float(finite.max()) + 1 if len(finite) else 0.0
            total = torch.where(own == float("inf"), top, own).sum(0)  # (n,)
            starts = list(range(0, len(slots), self.chunk))
            means = torch.stack([total[s: s + self.chunk].mean() for s in starts])  # kvpress: sum, then mean
            count = min(max(1, int(len(starts) * share)), len(starts))
            for index in torch.topk(means, count).indices.tolist():
                kept[layer, slots[starts[index]: starts[index] + self.chunk]] = True
            chunked[layer, slots] = means.repeat_interleave(self.chunk)[: len(slots)]
        expanded = chunked[:, None].expand(layers, heads, at).contiguous()
        evicted = candidates.alive & ~kept[:, None]
        budgets = (candidates.alive & ~evicted).sum(-1).clamp(min=1)
        rank = keep_rank(torch.where(evicted, float("-inf"), expanded))  # kept chunks first
        return Decision(at, expanded, budgets, candidates.alive, evicted, rank)
