"""The strip's bit picker under AppTest rounds to NVFP4 along tokens and refuses other axes in one line."""

from __future__ import annotations

from kvviz.quant.quantizer import Quantizer


def test_the_strips_bit_picker_rounds_to_nvfp4_and_refuses_other_axes_in_one_line():
    import re

    from tests.support.app_test import assert_clean, metric, start

    app = start()
    app.session_state["max_new_tokens"] = 4
    for message in ("Name three colours.", "And two more?"):  # history to round
        app.chat_input[0].set_value(message).run()
    app.selectbox(key="number_format").set_value("nvfp4").run()
    assert any("axis 'token'" in re.sub(r"\\(.)", r"\1", w.value) for w in app.warning)  # keys per channel: refused
    app.selectbox(key="key_axis").set_value("token").run()
    assert_clean(app)
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert_clean(app)
    draft = app.session_state["draft"]
    assert draft.keys == draft.values == Quantizer("token", format="nvfp4") and set(draft.key_bits.values()) == {4}
    assert float(metric(app, "KL")) > 0
