"""The what-if: re-run one real decode step on the full and on an edited cache, and measure the difference.

- :mod:`~kvviz.whatif.step` — :func:`what_if` and its result :class:`WhatIf`;
- :mod:`~kvviz.whatif.full_step` — the unedited run of a step, kept per session, and the caches edited runs get;
- :mod:`~kvviz.whatif.steps` — where an edit matters: its effect at every step of the newest turn;
- :mod:`~kvviz.whatif.continuation` — greedy continuations with both caches;
- :mod:`~kvviz.whatif.metrics` — KL, total variation, top-k side by side;
- :mod:`~kvviz.whatif.memory` — cache bytes, packed as an edit stores them;
- :mod:`~kvviz.whatif.compare_policies` — several policies' masks at one budget, side by side.
"""

from kvviz.whatif.compare_policies import PolicyComparison, PolicyRow, compare_policies
from kvviz.whatif.continuation import Continuation
from kvviz.whatif.memory import CacheBytes, cache_memory, step_memory
from kvviz.whatif.metrics import Candidate, NextToken, compare
from kvviz.whatif.step import Detail, WhatIf, what_if
from kvviz.whatif.steps import StepEffect, StepEffects, kept_effects, step_effects, turn_steps, unsaid_words

__all__ = ["CacheBytes", "Candidate", "Continuation", "Detail", "NextToken", "PolicyComparison", "PolicyRow",
           "StepEffect", "StepEffects", "WhatIf", "cache_memory", "compare", "compare_policies", "kept_effects", "step_effects", "step_memory", "turn_steps", "unsaid_words", "what_if"]
