"""The Channels view under AppTest draws the channel map and names the outliers."""

from __future__ import annotations

from kvviz.channels import channels

PROMPT = "My cat is called Whiskers and my dog is called Rex. The cat sleeps on the red sofa. What is my cat called?"


def test_the_channels_view_draws_and_names_outliers():
    from tests.support.app_test import assert_clean, open_view, start

    app = start()
    app.chat_input[0].set_value(PROMPT).run()
    open_view(app, "Channels")
    app.number_input(key="channels_layer").set_value(18).run()
    app.number_input(key="channels_kv_head").set_value(2).run()
    assert_clean(app)
    session = app.session_state["session"]
    outliers = channels(session, 18, 2, len(session) - 1).outliers  # the slots before the step shown
    assert any(f"Outlier key channels here: {', '.join(map(str, outliers))}" in c.value for c in app.caption)
    app.radio(key="channels_kind").set_value("values").run()
    assert_clean(app)
