"""An example of a press written against kvpress, as its users write one: a ScorerPress subclass in a file of its own.
kvviz runs it unchanged (kvpress' own code):

    .venv/bin/python -m kvviz policy-run --turn "…" --press-file assets/presses/far_keys_press.py:FarKeysPress \
        --param power=2 --ratio 0.5
    KVVIZ_POLICIES=assets/presses/far_keys_press.py bash scripts/app.sh

It keeps the keys whose norm lies farthest from their layer and head's mean norm (an outlier score).
"""

from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class FarKeysPress(ScorerPress):
    compression_ratio: float = 0.0
    power: float = 1.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        norms = keys.norm(dim=-1)  # (batch, KV heads, slots)
        return (norms - norms.mean(-1, keepdim=True)).abs() ** self.power
