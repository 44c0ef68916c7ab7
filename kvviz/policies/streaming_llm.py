"""StreamingLLM — Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (ICLR 2024).

Keeps the first ``sinks`` slots (attention sinks; the paper uses 4) and the most recent slots; the same for every
layer and head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.errors import KvvizError
from kvviz.policies.base import Candidates, Policy


@dataclass(frozen=True)
class StreamingLLM(Policy):
    name = "streaming_llm"
    uniform = True

    sinks: int = 4  # the first slots, always kept

    def __post_init__(self) -> None:
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise KvvizError(f"streaming_llm's sinks must be a non-negative integer, got {self.sinks!r}")

    def score(self, candidates: Candidates) -> torch.Tensor:
        slots = torch.arange(candidates.at, dtype=torch.float32)  # the most recent score highest ...
        return torch.where(slots < self.sinks, 2 * candidates.at - slots, slots)[None, None]  # ... after the sinks
