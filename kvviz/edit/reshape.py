"""What a policy run does to the cache besides evicting and quantizing, at every turn's prompt: ThinK's key-channel
prunings and MergingPress' merges of the slots the prompt's compression evicted (kvviz.policies.reshaping), as
kvpress' ``ThinKPress`` and ``MergingPress`` run during prefill. A later turn's merges read the values the earlier
turns' merges left (their ``round`` is the turn)."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.edit.parts import MERGE_RULES
from kvviz.errors import KvvizError


@dataclass(frozen=True)
class Reshape:
    think: float = 0.0  # share of key channels ThinK prunes at each prompt (0: none)
    think_window: int = 32  # the queries that score them: the prompt's last
    merge: bool = False  # merge what the prompt's compression evicts into the most similar kept slots
    merge_rule: str = "average"  # "average" (D2O, MergingPress) or "add" (CaM)
    merge_threshold: float = 0.0  # least key similarity to merge

    def __post_init__(self) -> None:
        if isinstance(self.think, bool) or not isinstance(self.think, (int, float)) or not 0 <= self.think < 1:
            raise KvvizError(f"ThinK's channel share must be in [0, 1), got {self.think!r}")
        if isinstance(self.think_window, bool) or not isinstance(self.think_window, int) or self.think_window < 1:
            raise KvvizError(f"ThinK's window must be a positive integer, got {self.think_window!r}")
        if self.merge_rule not in MERGE_RULES:
            raise KvvizError(f"the merge rule must be one of {', '.join(MERGE_RULES)}, got {self.merge_rule!r}")
        if not 0 <= self.merge_threshold <= 1:
            raise KvvizError(f"the merge threshold must be in [0, 1], got {self.merge_threshold!r}")

    @property
    def label(self) -> str:
        parts = ([f"ThinK prunes {self.think:.0%} of key channels at each prompt"] if self.think else []) + (
            [f"evicted slots merged ({self.merge_rule}" + (f", similarity ≥ {self.merge_threshold:g}"
                                                          if self.merge_threshold else "") + ")"]
            if self.merge else [])
        return ", ".join(parts)
