"""Greedy continuations after a what-if step (docs/math.md §6): the next tokens with the full and with the edited cache,
decoded one step at a time at true positions, with the edit's evicted slots kept hidden."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Cache

from kvviz.recorder import Probe, probing
from kvviz.session import Session


@dataclass
class Continuation:
    full: str
    edited: str
    full_ids: list[int]
    edited_ids: list[int]
    first_divergence: int | None  # the index of the first token that differs (0: the first already), None: none

    @property
    def parting(self) -> str:
        """Where the two continuations part, in words counted from the 1st token (as the page and the offline page
        say it)."""
        from kvviz.numbers import ordinal

        index = self.first_divergence
        if index is None:
            return "the same tokens"
        if index == 0:
            return "they differ from their 1st token on"
        return f"the same first {index} token{'s' * (index > 1)}, different from the {ordinal(index + 1)} on"


class _Hide(Probe):
    """Hides the slots of ``hidden`` ``(L, KV, n0)``; slots appended later stay visible."""

    def __init__(self, hidden: torch.Tensor | None):
        self.hidden = hidden

    def on_query(self, layer, query, key, value):
        if self.hidden is None:
            return None
        return ~torch.nn.functional.pad(self.hidden[layer], (0, key.shape[2] - self.hidden.shape[-1]))[None]


def greedy(session: Session, cache: Cache, hidden: torch.Tensor | None, first: torch.Tensor, position: int,
           steps: int) -> list[int]:
    """Up to ``steps`` greedy tokens after a step whose logits are ``first``, on ``cache`` (extended in place), with
    ``hidden`` slots hidden; stops after an end-of-turn token."""
    lm = session.lm
    token, ids = int(first.argmax()), []
    for offset in range(1, steps + 1):
        ids.append(token)
        if offset == steps or token in lm.stop_ids:
            break
        with torch.no_grad(), probing(_Hide(hidden)):
            out = lm.model(input_ids=torch.tensor([[token]], device=lm.device),
                           position_ids=torch.tensor([[position + offset]], device=lm.device),
                           cache=cache, use_cache=True, logits_to_keep=1)
        token = int(out.logits[0, -1].argmax())
    return ids


def compared(session: Session, full_ids: list[int], edited_ids: list[int]) -> Continuation:
    """The two continuations as text, with the index of the first token where they differ (None if they never do)."""
    pairs = list(zip(full_ids, edited_ids))
    diverged = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    if diverged is None and len(full_ids) != len(edited_ids):
        diverged = len(pairs)
    decode = lambda ids: session.lm.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    return Continuation(decode(full_ids), decode(edited_ids), full_ids, edited_ids, diverged)
