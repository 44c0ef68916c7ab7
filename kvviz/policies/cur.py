"""CUR (CurDKV) — Sengupta et al., "Value-Guided KV Compression for LLMs via Approximated CUR Decomposition" (2025,
arXiv:2509.15038).

Per layer and KV head: a slot's keep-score is an approximate leverage score of its key and value rows — the squared
row norms ``k2 = ‖k_i‖²`` and ``v2 = ‖v_i‖²``, each normalised within local windows of ``window`` consecutive
candidates (``local=True``; the last window shorter) or not at all, combined as ``leverage`` — ``kv_product``
(``k2·v2``, the default), ``kv_avg`` (``(k2 + v2)/2``), ``key`` or ``value`` — and normalised to sum to one over the
candidates; the first ``sinks`` slots score 1 (attention sinks). This is kvpress' ``CURPress`` (its deterministic
form: ``use_random_leverage=False``; the random projection it offers draws from the global generator unseeded, so no
run could reproduce it). ``ties="topk"`` keeps among equal scores what ``torch.topk`` keeps, as kvpress does. In a
decode-mode run the windows are those of the slots the layer and KV head still hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, TopkTies, checked_choices, choice


@dataclass(frozen=True)
class CUR(TopkTies):
    name = "cur"

    sinks: int = 4  # first slots always scored 1
    leverage: str = choice("kv_product", "kv_avg", "key", "value")
    local: bool = True  # normalise the row norms within windows of ``window`` slots
    window: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        checked_choices(self)
        for name in ("sinks", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (name == "window"):
                raise KvvizError(f"cur's {name} must be a {'positive' if name == 'window' else 'non-negative'} "
                                 f"integer, got {value!r}")

    def score(self, candidates: Candidates) -> torch.Tensor:
        lm, at = candidates.session.lm, candidates.at
        scores = torch.zeros(lm.layers, lm.kv_heads, at)
        for layer in range(lm.layers):
            keys, values = candidates.keys(layer).float(), candidates.values(layer).float()  # (KV, at, D)
            alive = candidates.alive[layer]
            if bool(alive.all()):
                scores[layer] = self.leverage_scores(keys, values).cpu()
                continue
            for head in range(lm.kv_heads):
                slots = alive[head].nonzero()[:, 0]
                if len(slots):
                    own = slots.to(keys.device)
                    scores[layer, head, slots] = self.leverage_scores(keys[head, own][None],
                                                                      values[head, own][None])[0].cpu()
        scores[..., : self.sinks] = 1.0
        return scores

    def leverage_scores(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``(KV, n)`` normalised leverage scores of keys and values ``(KV, n, D)`` (before the sinks' 1)."""
        k2, v2 = (keys ** 2).sum(-1), (values ** 2).sum(-1)  # (KV, n)
        if self.local:
            k2, v2 = self._windowed(k2), self._windowed(v2)
        combined = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[self.leverage]
        return combined / combined.sum(-1, keepdim=True)

    def _windowed(self, norms: torch.Tensor) -> torch.Tensor:
        """``norms`` ``(KV, n)`` divided by their sum within each window of ``window`` consecutive slots."""
        heads, n = norms.shape
        w = self.window
        padded = functional.pad(norms, (0, (w - n % w) % w)).reshape(heads, -1, w)
        return (padded / padded.sum(-1, keepdim=True)).reshape(heads, -1)[:, :n]
