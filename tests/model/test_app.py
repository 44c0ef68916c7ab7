"""The page's library side on the bundled model: a bad session import refused with the session kept, each what-if
demo's claim (``check_claim``), and the end-of-turn token that closed a reply marked as cached late."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("payload", ['{"format": "other"}', '{"format": "kvviz-session", "version": 99}'])
def test_bad_import_is_refused_and_keeps_the_session(lm, payload):
    from kvviz.errors import KvvizError
    from kvviz.session_file import import_session

    with pytest.raises(KvvizError, match="cannot import"):
        import_session(lm, json.loads(payload))


@pytest.mark.parametrize("name", ["Evict a fact", "Instruction kept vs evicted", "Attention sinks"])
def test_each_demo_shows_what_it_claims_on_the_bundled_model(lm, name):
    from kvviz.scenarios import check_claim, demo_view, load_scenarios, run_scenario
    from kvviz.whatif import what_if

    scenario = next(s for s in load_scenarios() if s.name == name)
    session, draft, at = run_scenario(lm, scenario)
    assert check_claim(session, draft, at, scenario) == []
    view = demo_view(session, draft, at, scenario)
    rho = what_if(session, draft.edit(at), at=at).heads["rho"]
    assert float(rho[view["layer"], view["head"]]) == pytest.approx(float(rho.max()))


def test_the_end_of_turn_that_closed_a_reply_is_marked_cached_late(lm):
    from kvviz.edit.draft import EditDraft
    from kvviz.session import Session
    from kvviz.view_data import strip_chips

    session = Session(lm)
    session.add_user_turn("Say hi.")
    session.generate(24)
    first = len(session)
    session.add_user_turn("And bye?")
    chips = strip_chips(session, EditDraft(), len(session) - 1, 0, None)
    late = [c[0] for c in chips if c[16]]
    assert session.pending is not None and chips[first][1] == "<|im_end|>" and late == [first]
    assert chips[first][3] == 1 and chips[first][2] == 1  # it stays in turn 2's query segment (where it was cached)
