"""A press (kvpress' ScorerPress shape, kvpress not imported) whose score ends the process."""

import sys
from dataclasses import dataclass


@dataclass
class ExitingPress:
    compression_ratio: float = 0.5

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        sys.exit(0)
