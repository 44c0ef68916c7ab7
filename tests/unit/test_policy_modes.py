"""Policy-run settings refused in one line before any model runs, and kvpress' DecodingPress mapped to compressions
after every N steps."""

from __future__ import annotations

import pytest

from kvviz.errors import KvvizError
from kvviz.policies import (H2O)
from kvviz.runs.compressed import RunSettings
from kvviz.schemes.kivi import Kivi


@pytest.mark.parametrize("settings, words", [
    (dict(policy=H2O(), budget=0), "keeps no slot"), (dict(policy=H2O(), budget=-3), "non-negative"),
    (dict(policy=None, budget=16, cache_format=Kivi()), "needs a policy"),
    (dict(policy=H2O(), budget=None), "needs a budget"),
    (dict(policy=H2O(), budget=16, mode="prefill", every=2), "every N steps"),
    (dict(policy=None, budget=None), "needs a policy, a reader, a quantized cache"), (dict(policy=H2O(), budget=16, every=0), "positive")])
def test_bad_settings_are_refused_in_one_line(settings, words):
    with pytest.raises(KvvizError, match=words) as caught:
        RunSettings(**settings)
    assert "\n" not in str(caught.value)


def test_decoding_press_maps_to_after_steps():
    from kvviz.policies.kvpress.presses import from_kvpress

    press = from_kvpress("DecodingPress", base_press="KnormPress", compression_interval="8", target_size="256")
    assert (press.policy, press.ratio, press.mode, press.every) == (from_kvpress("KnormPress").policy, 256,
                                                                    "after_steps", 8)
    with pytest.raises(KvvizError, match="give base_press=NAME"):
        from_kvpress("DecodingPress")
    own = from_kvpress("DecodingPress", base_press="LagKVPress")  # its partitions follow kvpress' cache order:
    assert type(own.policy.instance).__name__ == "DecodingPress" and own.mode == "decode"  # kvpress' own code
    with pytest.raises(KvvizError, match="not by a compression ratio"):
        from_kvpress("DecodingPress", base_press="KnormPress", compression_ratio=0.5)
