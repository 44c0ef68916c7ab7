"""The strip's bit picker under AppTest rounds to NVFP4 along tokens and refuses other axes in one line."""

from __future__ import annotations

from kvviz.quant.quantizer import Quantizer


def test_a_format_with_its_own_axis_and_width_fits_itself_and_the_edit_applies_at_once():
    """The edit being tried is 2-bit int (keys per channel); choosing NVFP4 sets keys and values per token and every
    quantized slot and the picker to 4 bits, says so, and the what-if follows at once — no "settings do not fit", no
    Clear edit; MXFP4 likewise, FP8 to 8 bits (its axes as they are)."""
    import re

    from tests.support.app_test import assert_clean, metric, start

    app = start()
    app.session_state["max_new_tokens"] = 4
    for message in ("Name three colours.", "And two more?"):  # history to round
        app.chat_input[0].set_value(message).run()
    app.selectbox(key="pick_k").set_value(2).run()
    app.selectbox(key="pick_v").set_value(2).run()
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert set(app.session_state["draft"].key_bits.values()) == {2}
    app.selectbox(key="number_format").set_value("nvfp4").run()
    assert_clean(app)
    assert not app.warning, [w.value for w in app.warning]
    said = [re.sub(r"\\(.)", r"\1", m.value) for m in [*app.markdown, *app.info, *app.caption]]
    assert any("nvfp4 stores 4 bits" in t and "keys and values per token" in t and "to 4 bits" in t for t in said), said
    draft = app.session_state["draft"]
    assert draft.keys == draft.values == Quantizer("token", format="nvfp4")
    assert set(draft.key_bits.values()) == set(draft.value_bits.values()) == {4}
    assert (app.session_state["pick_k"], app.session_state["pick_v"]) == (4, 4)
    assert float(metric(app, "KL")) > 0
    app.selectbox(key="number_format").set_value("mxfp4").run()
    assert_clean(app)
    assert not app.warning and app.session_state["draft"].keys == Quantizer("token", format="mxfp4")
    app.selectbox(key="key_axis").set_value("head").run()
    app.selectbox(key="number_format").set_value("e4m3").run()  # FP8: 8 bits, scales per head as chosen
    assert_clean(app)
    assert not app.warning and set(app.session_state["draft"].key_bits.values()) == {8}
    assert app.session_state["draft"].keys == Quantizer("head", format="e4m3")
    assert float(metric(app, "KL")) >= 0
    app.selectbox(key="key_axis").set_value("channel").run()
    app.selectbox(key="number_format").set_value("nvfp4").run()
    app.selectbox(key="key_axis").set_value("channel").run()  # chosen by hand afterwards: refused in one line
    assert any("axis 'token'" in re.sub(r"\\(.)", r"\1", w.value) for w in app.warning)
