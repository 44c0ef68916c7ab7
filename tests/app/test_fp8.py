"""The page under AppTest quantizes to FP8 and refuses other widths in one line."""

from __future__ import annotations

from kvviz.quant.quantizer import Quantizer


def test_the_page_quantizes_to_fp8_and_refuses_other_widths_in_one_line():
    import re

    from tests.support.app_test import assert_clean, metric, start

    app = start()
    app.session_state["max_new_tokens"] = 4
    for message in ("Name three colours.", "And two more?"):
        app.chat_input[0].set_value(message).run()
    app.selectbox(key="number_format").set_value("e4m3").run()
    app.selectbox(key="key_axis").set_value("head").run()
    app.selectbox(key="pick_k").set_value(8).run()
    app.selectbox(key="pick_v").set_value(8).run()
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert_clean(app)
    draft = app.session_state["draft"]
    assert draft.keys == Quantizer("head", format="e4m3") and set(draft.key_bits.values()) == {8}
    assert float(metric(app, "KL")) > 0
    app.selectbox(key="pick_k").set_value(4).run()
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert_clean(app)
    assert any("stores 8 bits per element" in re.sub(r"\\(.)", r"\1", w.value) for w in app.warning)
