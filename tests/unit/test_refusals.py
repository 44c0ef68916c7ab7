"""Every policy parameter finite in float32 and inside its range, and each way a number can be bad refused in one
line (kvviz.numbers)."""

from __future__ import annotations

import pytest

from kvviz.errors import KvvizError
from kvviz.numbers import FLOAT32_MAX, number, press_budgets


@pytest.mark.parametrize("name, params, message", [
    ("pyramid_kv", {"beta": "nan"}, "pyramid_kv's beta must be a number, got NaN"),
    ("pyramid_kv", {"beta": "1e39"}, "must be finite"),  # finite in Python, infinite as float32
    ("pyramid_kv", {"beta": float("nan")}, "got NaN"),  # a number from the app's widgets, not text
    ("pyramid_kv", {"beta": -1.0}, "beta must be above 0"),
    ("expected_attention", {"epsilon": "-1"}, "epsilon must be at least 0"),
    ("snapkv", {"window": "1e12"}, "must be an integer"),
    ("streaming_llm", {"sinks": "99999999999"}, "must be finite and at most"),
    ("h2o", {"recent_fraction": "inf"}, "must be finite"),
])
def test_policy_parameters_are_finite_in_float32_and_in_range(name, params, message):
    from kvviz.policies import POLICIES
    from kvviz.policies.by_name import policy_named

    with pytest.raises(KvvizError, match=message.replace("(", r"\(")):
        policy_named(POLICIES, name, params)


def test_good_parameters_still_pass():
    from kvviz.policies import POLICIES
    from kvviz.policies.by_name import policy_named

    assert policy_named(POLICIES, "pyramid_kv", {"beta": "20"}).beta == 20.0
    assert policy_named(POLICIES, "expected_attention", {"epsilon": "0.01"}).epsilon == 0.01
    assert policy_named(POLICIES, "streaming_llm", {"sinks": "4"}).sinks == 4


def test_number_checks_each_way_a_number_can_be_bad():
    assert number("0.5", "x", 0, 1, below=True) == 0.5
    assert number(3, "x", integer=True) == 3 and number(3.0, "x", integer=True) == 3
    assert number(FLOAT32_MAX, "x") == FLOAT32_MAX
    for bad, words in [(True, "must be a number"), ("abc", "must be a number"), (float("nan"), "NaN"),
                       (float("inf"), "finite"), (1e39, "finite"), (-1e39, "finite"), (1.0, "in [0, 1)"),
                       (-0.1, "in [0, 1)")]:
        with pytest.raises(KvvizError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            number(bad, "x", 0, 1, below=True)
    with pytest.raises(KvvizError, match="must be an integer"):
        number(2.5, "x", integer=True)
    with pytest.raises(KvvizError, match="at most 2.147e"):
        number(2**31, "x", integer=True)
    assert press_budgets({"compression_ratio": "0.25", "target_size": "64", "window_size": "x"}) == {
        "compression_ratio": 0.25, "target_size": 64}
