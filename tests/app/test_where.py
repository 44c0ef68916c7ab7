"""The what-if points at the step where an edit matters most, through AppTest on the bundled model: evicting the
dog's name looks harmless at the newest step, one button finds the step that chose the name, and one more goes there,
where the what-if's own numbers are the ones the pointer gave."""

from __future__ import annotations

import re

import pytest

from kvviz.scenarios import find_slots
from tests.support.app_test import assert_clean, metric, start


def test_an_eviction_points_at_the_step_that_chose_the_answer():
    app = start()
    app.chat_input[0].set_value("My cat is called Whiskers and my dog is called Rex. What is my dog called?").run()
    session = app.session_state["session"]
    assert " Rex" in session.reply
    app.session_state["draft"].evict_many(find_slots(session, " Rex"))
    app.run()
    assert_clean(app)
    newest_kl = float(metric(app, "KL"))
    assert not any(m.value.startswith("**Matters most") for m in app.markdown)  # asked for, not run on every click
    app.button(key="find-worst").click().run()
    assert_clean(app)
    pointer = next(m.value for m in app.markdown if m.value.startswith("**Matters most at step "))
    step, kl = re.match(r"\*\*Matters most at step (\d+)\*\*.*\(KL ([\d.e+-]+) nats", pointer).groups()
    # the name was chosen there, and without it something else is, in words; the name itself falls in rank
    assert "which chose `␣Rex`: the top-1 becomes `" in pointer
    assert re.search(r"and `␣Rex` falls from rank 1 to \d+ \(", pointer), pointer
    assert float(kl) > 10 * newest_kl
    assert f"here, step {len(session) - 1}: {newest_kl:.3g})" in pointer  # this step's, beside it
    assert not [i for i in app.info if "The reply never says" in i.value]  # it said the name

    app.button(key="look-at-worst").click().run()
    assert_clean(app)
    assert app.session_state["at"] == int(step)
    assert metric(app, "Top-1") == "FLIPS"
    # the what-if of that step, run alone, says what the batched pass said (both shown to 3 significant digits)
    assert float(metric(app, "KL")) == pytest.approx(float(kl), rel=1e-2)
    assert any("this one is where the edit matters most" in c.value for c in app.caption)
    assert app.session_state["draft"].evicted  # the edit stays as it was


def test_an_eviction_of_a_fact_the_reply_never_says_is_named_as_such():
    """Asked the dog's breed, the model answers without the name: evicting it says so plainly, and the pointer says
    what the eviction did to the name's rank at the step where it matters most."""
    app = start()
    app.chat_input[0].set_value("My dog is called Rex and he is three years old. What breed is my dog?").run()
    session = app.session_state["session"]
    assert "Rex" not in session.reply
    app.session_state["draft"].evict_many(find_slots(session, " Rex"))
    app.run()
    assert_clean(app)
    assert [i.value for i in app.info if i.value.startswith("The reply never says `Rex`: it answered without")]
    app.button(key="find-worst").click().run()
    assert_clean(app)
    pointer = next(m.value for m in app.markdown if m.value.startswith("**Matters most at step "))
    assert re.search(r"`␣Rex` (falls|rises) from rank \d+ to \d+", pointer), pointer
