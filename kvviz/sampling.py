"""How the next token is chosen (greedy, or temperature / top-p sampling from a seeded generator), and the chosen
token with its text."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from kvviz.errors import KvvizError


@dataclass(frozen=True)
class Sampling:
    """Decoding settings: greedy when ``temperature == 0``, else temperature/top-p sampling with a seeded generator."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.temperature <= 10:
            raise KvvizError(f"temperature must be between 0 and 10, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise KvvizError(f"top_p must be in (0, 1], got {self.top_p}")

    def generator(self) -> torch.Generator:
        """A CPU generator seeded with ``seed`` (one per session: its draws follow the session's steps)."""
        return torch.Generator().manual_seed(self.seed)

    def choose(self, logits: torch.Tensor, generator: torch.Generator) -> int:
        """The next token for ``logits`` ``(V,)``: the argmax when greedy, else a draw from the warped distribution."""
        if self.temperature == 0:
            return int(logits.argmax())
        scores = TemperatureLogitsWarper(self.temperature)(None, logits[None])
        if self.top_p < 1:
            scores = TopPLogitsWarper(self.top_p)(None, scores)
        probs = torch.softmax(scores[0], dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=generator))


@dataclass(frozen=True)
class Token:
    """A token chosen by the model and its text piece."""

    id: int
    text: str
