"""There are four tours, each with its story."""

from __future__ import annotations

import json

from kvviz.tours import TOURS, load_tours

TOUR_NAMES = [tour.name for tour in load_tours()]


def test_there_are_four_tours_with_their_stories():
    assert TOUR_NAMES == ["What the KV cache is", "Eviction: what ρ and α′ mean", "Quantization: why keys per channel",
                          "A policy on a follow-up question"]
    for path in sorted(TOURS.glob("*.json")):
        json.loads(path.read_text())  # each file is plain JSON a speaker can edit
