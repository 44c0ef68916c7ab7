"""kvpress' own code in kvviz: a press's ``score(module, hidden_states, keys, values, attentions, kwargs)`` run
unchanged on a policy run's candidates, its scores ranked and budgeted as every kvviz policy's.

kvpress itself does not import beside kvviz's transformers (0.5.5 pins transformers < 5.3 and patches attention
functions when imported), so the press is a class written in kvpress' shape — a ``ScorerPress`` subclass copied from
kvpress' source, or your own — with a ``score`` method of that signature. Per layer it receives, as kvpress gives
them: the attention module (``q_proj``, ``head_dim``, ``config``), the attention's input ``hidden_states``
``(1, at, hidden)``, the cached ``keys`` / ``values`` ``(1, KV, at, D)`` post-RoPE, ``attentions`` None (as under
kvpress' default sdpa attention) and ``kwargs`` with ``position_embeddings`` (the rotary ``cos, sin`` of the
candidates' positions). It returns ``(1, KV, at)`` scores, higher kept. The hidden states are recorded in policy
runs only (``reads_hidden``); kvpress compresses a prompt once, so run such a press in prefill mode — in the decode
modes the press also sees the slots evicted earlier (they are never kept again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, Policy


@dataclass(frozen=True)
class KvpressScorer(Policy):
    name = "kvpress_code"
    reads_hidden = True

    press: object = field(default=None)  # an instance of a class in kvpress' ScorerPress shape

    def __post_init__(self) -> None:
        if not callable(getattr(self.press, "score", None)):
            raise KvvizError("kvpress_code needs a press with a score(module, hidden_states, keys, values, "
                             "attentions, kwargs) method")

    def settings(self) -> dict[str, str]:
        return {"press": type(self.press).__name__}

    def score(self, candidates: Candidates) -> torch.Tensor:
        lm = candidates.session.lm
        kwargs = {"position_embeddings": candidates.position_embeddings(), "attention_mask": None}
        scores = []
        with torch.no_grad():
            for layer in range(lm.layers):
                keys, values = candidates.keys(layer)[None], candidates.values(layer)[None]
                hidden = candidates.hidden_states(layer)[None]
                scored = self.press.score(candidates.module(layer), hidden, keys, values, None, kwargs)
                scores.append(scored[0].float().cpu())
        return torch.stack(scores)  # (L, KV, at)
