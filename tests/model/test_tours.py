"""Every tour step's numbers are the live model's (each step's ``expect`` holds, and changing a number in a tour file
makes it fail); steps on the same policy demo share its run."""

from __future__ import annotations

import dataclasses

import pytest

from kvviz.tours import check, load_tours, play, stage
from kvviz.whatif import what_if

TOUR_NAMES = [tour.name for tour in load_tours()]


@pytest.mark.parametrize("index", range(len(TOUR_NAMES)))
def test_every_steps_numbers_are_the_models(lm, index):
    tour = load_tours()[index]
    session = play(lm, tour)
    for step in tour.steps:
        shown = stage(session, step)
        assert check(shown, step) == [], (tour.name, step.caption[:40])
        caption = shown.caption(step)
        assert "{" not in caption  # every field filled
        if shown.at > 0 and "kl" in step.caption:
            result = what_if(session, shown.draft.edit(shown.at), at=shown.at, layer=shown.layer, head=shown.head)
            assert shown.numbers["kl"] == result.next_token.kl  # computed, not written in the file
        for key, wanted in step.expect.items():  # a number changed in the file fails the check
            if isinstance(wanted, bool) or not isinstance(wanted, (int, float)):
                continue
            value = shown.numbers[key[4:]] if key[:4] in ("min_", "max_") else shown.numbers[key]
            moved = value + 1 if key.startswith("min_") else value - 1 if key.startswith("max_") else value + 1
            broken = dataclasses.replace(step, expect={key: moved})
            assert check(shown, broken), (tour.name, key)


def test_steps_on_the_same_policy_demo_share_its_run(lm):
    tour = next(t for t in load_tours() if any(step.policy_run for step in t.steps))
    session = play(lm, tour)
    runs = [stage(session, step).policy_run for step in tour.steps if step.policy_run]
    assert len(runs) == 2 and runs[0][0] is runs[1][0] and runs[0][1] is runs[1][1]  # one run, then its blame
