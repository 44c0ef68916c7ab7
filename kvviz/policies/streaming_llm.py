"""StreamingLLM — Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (ICLR 2024).

Keeps the first ``sinks`` slots (attention sinks; the paper uses 4) and the most recent slots; the same for every
layer and head.
"""

from __future__ import annotations

import torch

from kvviz.policies.base import Policy


class StreamingLLM(Policy):
    name = "streaming_llm"

    def __init__(self, sinks: int = 4):
        self.sinks = sinks

    def scores(self, session, at, keep):
        slots = torch.arange(at, dtype=torch.float32)
        return torch.where(slots < self.sinks, torch.inf, slots)[None, None]
