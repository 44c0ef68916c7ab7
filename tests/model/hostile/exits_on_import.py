"""A press file that ends the process while it is imported: policy-run ended with exit 0 and no output."""

import sys

sys.exit(0)


class QuietPress:
    compression_ratio: float = 0.5

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys.norm(dim=-1)
