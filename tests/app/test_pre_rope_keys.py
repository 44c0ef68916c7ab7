"""The page under AppTest rounds keys before RoPE when its quantizer settings ask for it."""

from __future__ import annotations

from kvviz.quant.quantizer import Quantizer
from kvviz.rope import rope_frequencies


def test_the_page_rounds_keys_before_rope(lm):
    from tests.support.app_test import assert_clean, metric, start

    app = start()
    app.session_state["max_new_tokens"] = 3
    for message in ("Name three colours.", "And two more?"):
        app.chat_input[0].set_value(message).run()
    app.toggle(key="pre_rope").set_value(True).run()
    app.selectbox(key="pick_k").set_value(2).run()
    app.selectbox(key="pick_v").set_value(16).run()
    next(b for b in app.button if b.label == "History → these bits").click().run()
    assert_clean(app)
    draft = app.session_state["draft"]
    assert draft.keys == Quantizer("channel", rope=rope_frequencies(lm)) and draft.values.rope is None
    assert float(metric(app, "KL")) > 0
