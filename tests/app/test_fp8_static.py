"""The page under AppTest quantizes with calibrated static FP8 scales."""

from __future__ import annotations

from kvviz.schemes.calibration import calibrate


def test_the_page_quantizes_with_calibrated_fp8_scales(lm):
    from tests.support.app_test import assert_clean, metric, start

    app = start()
    app.session_state["max_new_tokens"] = 3
    for message in ("Name three colours.", "And two more?"):
        app.chat_input[0].set_value(message).run()
    app.selectbox(key="number_format").set_value("e4m3").run()
    app.selectbox(key="key_axis").set_value("head").run()
    app.selectbox(key="value_axis").set_value("tensor").run()
    app.selectbox(key="fp8_scales").set_value("calibrated").run()
    app.selectbox(key="pick_k").set_value(8).run()
    app.selectbox(key="pick_v").set_value(8).run()
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert_clean(app)
    draft = app.session_state["draft"]
    keys, _ = calibrate(lm).quantizers("e4m3", "head")
    _, values = calibrate(lm).quantizers("e4m3", "tensor")
    assert (draft.keys, draft.values) == (keys, values)
    assert float(metric(app, "KL")) > 0
