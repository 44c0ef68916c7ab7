"""Words the page prints, as a newcomer reads them: a committed edit names its bits, format and axis; counts said as
places (every 2nd, not "every 2th")."""

from __future__ import annotations

import pytest

from kvviz.figures.policy_run_charts import slot_axis
from kvviz.numbers import ordinal
from kvviz.quant.quantizer import Quantizer
from kvviz.view_data import quantized_words


@pytest.mark.parametrize("n, said", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                                     (13, "13th"), (21, "21st"), (22, "22nd"), (102, "102nd"), (111, "111th")])
def test_ordinals(n, said):
    assert ordinal(n) == said


@pytest.mark.parametrize("bits, quantizer, noun, said", [
    ({3: 4, 4: 4, 5: 4}, Quantizer("channel"), "keys", "3 keys to int4 per channel"),
    ({3: 4, 4: 4, 5: 2}, Quantizer("token"), "values", "2 values to int4 and 1 to int2, per token"),
    ({3: 4}, Quantizer("token", format="nvfp4", group_size=16), "keys", "1 key to NVFP4 per token"),
    ({3: 8, 4: 8}, Quantizer("head", format="e4m3"), "values", "2 values to FP8 E4M3 per head"),
    ({3: 16}, Quantizer("channel"), "keys", "1 key back to 16 bits"),
    ({}, Quantizer("channel"), "keys", ""),
])
def test_a_quantization_is_said_with_its_bits_format_and_axis(bits, quantizer, noun, said):
    assert quantized_words(bits, quantizer, noun) == said


def test_a_long_slot_axis_names_every_kth_slot_in_english():
    labels = [f"{i} x" for i in range(30)]  # 300 px fit 16 labels (LABEL_PX 14 below 70 px of frame): every 2nd
    assert slot_axis(labels, 300)["title"] == "slot (every 2nd named)"
    assert slot_axis(labels[:16], 300)["title"] == "slot"
