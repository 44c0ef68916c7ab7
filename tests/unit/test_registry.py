"""The one policy table (kvviz.policies.registry) and the one builder of a run's settings from names
(kvviz.runs.from_names) that the command line, the app, sweeps and scenarios call."""

from __future__ import annotations

import dataclasses

import pytest

from kvviz.errors import KvvizError
from kvviz.policies import POLICIES
from kvviz.policies.base import Ratio
from kvviz.policies.registry import chosen, entries, is_press, make_policy, names
from kvviz.runs.from_names import from_names
from kvviz.schemes.kivi import Kivi
from kvviz.schemes.quanto import QuantoCache
from kvviz.schemes.written import QUANTIZED_FP8, WrittenCache

TABLE = entries()


@pytest.mark.parametrize("name", list(TABLE))
def test_every_name_of_the_table_builds_a_run_with_its_defaults(name):
    """Each row — kvviz's policies, then kvpress' presses by name — builds with the defaults it lists, and the run
    built from the name alone holds that very policy (a press at kvpress' ratio, compressing after the prompt)."""
    row = TABLE[name]
    pick = chosen(POLICIES, name, {parameter: default for parameter, default, _ in row.parameters})
    assert pick.policy == chosen(POLICIES, name).policy
    if row.source == "kvviz":
        fields = {f.name: f.default for f in dataclasses.fields(POLICIES[name]) if not f.metadata.get("hidden")}
        assert [(p, d) for p, d, _ in row.parameters] == list(fields.items())
        settings = from_names(name, budget=16, classes=POLICIES)
        assert (settings.policy, settings.budget, settings.mode, settings.positions) == (
            pick.policy, 16, pick.mode or "decode", "original")  # a two-stage policy (rocket_kv) compresses the prompt
        assert (settings.reader, settings.reads) == (pick.reader, pick.reads)
    else:
        assert row.source == "kvpress" and is_press(name)
        settings = from_names(name, ratio=0.5, mode="prefill", classes=POLICIES)
        assert (settings.policy, settings.budget, settings.mode) == (pick.policy, Ratio(0.5), "prefill")


def test_the_table_lists_kvviz_first_then_the_presses():
    assert list(TABLE) == names(POLICIES) and list(TABLE)[: len(POLICIES)] == list(POLICIES)
    assert "kvpress:SnapKVPress" in TABLE and TABLE["kvpress:SnapKVPress"].parameters[0][0] == "window_size"
    with pytest.raises(KvvizError, match="unknown policy 'nope'; choose one of streaming_llm"):
        chosen(POLICIES, "nope")


def test_a_press_brings_how_kvpress_runs_it():
    """kvpress' ratio, DecodingPress' interval and target size, KeyRerotationPress' positions come with the press;
    what the caller gives instead is refused where it would contradict it."""
    snap = from_names("kvpress:SnapKVPress", {"compression_ratio": "0.25"}, classes=POLICIES)
    assert (snap.budget, snap.mode, snap.every) == (Ratio(0.25), "prefill", 1)
    decoding = from_names("kvpress:DecodingPress", {"base_press": "KnormPress", "compression_interval": "4",
                                                    "target_size": "32"}, classes=POLICIES)
    assert (decoding.budget, decoding.mode, decoding.every, decoding.policy.name) == (32, "after_steps", 4, "key_norm")
    rerotated = from_names("kvpress:KeyRerotationPress", {"press": "StreamingLLMPress"}, ratio=0.5, classes=POLICIES)
    assert rerotated.positions == "rerotated" and rerotated.policy.name == "streaming_llm"
    with pytest.raises(KvvizError, match="give the budget once"):
        from_names("kvpress:SnapKVPress", {"compression_ratio": "0.25"}, ratio=0.5, classes=POLICIES)
    with pytest.raises(KvvizError, match="DecodingPress sets the interval"):
        from_names("kvpress:DecodingPress", {"base_press": "KnormPress"}, every=3, classes=POLICIES)
    with pytest.raises(KvvizError, match="KeyRerotationPress re-rotates"):  # a step's eviction has no positions
        make_policy(POLICIES, "kvpress:KeyRerotationPress", {"press": "StreamingLLMPress"})


def test_cache_formats_by_name_and_the_refusals_of_a_run_built_from_names():
    assert from_names(schemes=["kivi-2"]).cache_format == Kivi(2, 2)
    assert from_names(schemes=["quanto-4"], residual=8).cache_format == QuantoCache(4, 64, 8)
    assert from_names(schemes=["quantized-fp8"]).cache_format == QUANTIZED_FP8
    assert from_names("h2o", budget=8, schemes=["nvfp4"], round_own=True, classes=POLICIES).cache_format == \
        WrittenCache("nvfp4", own=True)
    assert from_names("h2o", budget=8, schemes=["fp16"], classes=POLICIES).cache_format is None
    refusals = [
        (lambda: from_names("h2o", budget=8, ratio=0.5, classes=POLICIES), "give --budget or --ratio, not both"),
        (lambda: from_names(kivi=Kivi(), schemes=["nvfp4"]), "one cache: KIVI K2/V2 and nvfp4 cannot be combined"),
        (lambda: from_names(schemes=["quanto-4", "quantized-fp8"]), "one cache: QuantizedCache"),
        (lambda: from_names(params={"window": "4"}, schemes=["kivi-2"]), "need a policy to take them"),
        (lambda: from_names("h2o", classes=POLICIES), "needs a budget"),
        (lambda: from_names(), "a run needs a policy, a reader, a quantized cache"),
        (lambda: from_names("h2o", {"nope": "1"}, budget=8, classes=POLICIES), "h2o has no parameter 'nope'"),
        (lambda: from_names("h2o", budget=8, press_file="x.py:X"), "give --policy or --press-file, not both"),
    ]
    for call, message in refusals:
        with pytest.raises(KvvizError, match=message) as refusal:
            call()
        assert "\n" not in str(refusal.value)


def test_a_sweep_case_and_a_scenario_build_their_runs_as_the_command_line_does():
    from kvviz.sweeps.cases import Case, run_settings
    from kvviz.sweeps.prompts import Prompt

    case = Case(Prompt("p", ("hi",), None, "kv"), "kvpress:SnapKVPress", Ratio(0.5), "prefill", 1, 4, "kivi-4")
    assert run_settings(case, POLICIES) == from_names("kvpress:SnapKVPress", ratio=0.5, mode="prefill",
                                                      schemes=["kivi-4"], classes=POLICIES)
