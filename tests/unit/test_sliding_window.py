"""Sliding-window layers, first-class: tiny Mistral (every layer windowed) and Gemma 2 (local and global layers, scores
soft-capped), randomly initialised from their configs. kvviz keeps every slot in every layer; a layer's window hides
the slots it left behind exactly as the model's own mask does, and the views and byte counts say so."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.model import LoadedModel, resolve_checkpoint
from kvviz.view_data import strip_chips, window_start
from kvviz.whatif import step_memory, what_if
from kvviz.tiny_models import WINDOW
from kvviz.tiny_sessions import tiny_pair
from tests.support.rounding import logit_rounding, probability_rounding

TURNS = ["a = 3, b = 5. What is a + b?", "And a - b?"]
WINDOWS = {"mistral": (WINDOW, WINDOW, WINDOW), "gemma2": (WINDOW, None, WINDOW)}  # as the configs in tiny_models say


def windows(lm: LoadedModel) -> tuple[int | None, ...]:
    return WINDOWS[lm.config.model_type]


@pytest.fixture(scope="module", params=["mistral", "gemma2"])
def windowed(request):
    """A tiny windowed model through kvviz, a session of two turns on it, and the same weights with eager attention."""
    lm, eager, session = tiny_pair(request.param, AutoTokenizer.from_pretrained(resolve_checkpoint(None)[0]), TURNS)
    assert len(session) > 3 * WINDOW
    return lm, eager, session


def test_the_layers_windows_are_read_from_the_config(windowed):
    lm, _, _ = windowed
    assert lm.attention.windows == windows(lm)
    assert lm.attention.softcap == (2.0 if lm.config.model_type == "gemma2" else None)


def test_a_slot_outside_a_layers_window_is_not_visible_there(windowed):
    lm, _, session = windowed
    at = len(session) - 1
    for layer in range(lm.layers):
        row = session.weights(layer, at, at + 1)[:, 0]  # (H, at + 1)
        start = 0 if windows(lm)[layer] is None else at - WINDOW + 1
        assert window_start(session, at, layer) == start
        assert torch.all(row[:, :start] == 0) and torch.all(row[:, start:] > 0)
        chips = strip_chips(session, EditDraft(), at, layer, None)
        assert [chip[10] for chip in chips] == [int(slot < start) for slot in range(at + 1)]


def _masks(lm: LoadedModel, n: int, evicted: list[int]) -> dict[str, torch.Tensor]:
    """Float 4D masks ``(1, 1, n, n)`` per layer kind (0 = attend, -inf = hidden): causal, the window in local layers,
    and the last row (the step under test) also without ``evicted``."""
    masks = {}
    for kind, window in (("full_attention", None), ("sliding_attention", WINDOW)):
        rows, slots = torch.arange(n)[:, None], torch.arange(n)[None]
        allowed = (slots <= rows) & ((rows - slots < window) if window else True)
        allowed[-1, evicted] = False
        masks[kind] = torch.zeros(n, n).masked_fill(~allowed, float("-inf"))[None, None]
    return masks


def test_a_what_if_eviction_equals_a_masked_forward_without_cache(windowed):
    """Evicted slots inside and outside the step's window: the edited next-token distribution equals one no-cache eager
    forward whose last row hides them (each earlier row sees what its own step saw)."""
    lm, eager, session = windowed
    at = len(session) - 1
    evicted = [2, at - WINDOW, at - 5, at - 2]  # two outside the windows, two inside
    masks = _masks(lm, at + 1, evicted)
    mask = masks if lm.config.model_type == "gemma2" else masks["sliding_attention"]  # Mistral: one kind of layer
    with torch.no_grad():
        out = eager(input_ids=torch.tensor([session.transcript.ids[: at + 1]]), attention_mask=mask, use_cache=False)
    reference = torch.softmax(out.logits[0, -1].double(), -1)
    result = what_if(session, Edit.evict(evicted), at=at, topk=20)
    rel = probability_rounding(logit_rounding(lm.config, out.logits[0, -1]))
    for candidate in result.next_token.edited:
        assert candidate.prob == pytest.approx(float(reference[candidate.id]), rel=rel)
    assert result.next_token.kl > 0


def test_evicting_slots_a_layer_no_longer_holds_changes_nothing_in_that_layer(windowed):
    lm, _, session = windowed
    at = len(session) - 1
    gone = list(range(at - WINDOW + 1))  # outside every window at this step
    result = what_if(session, Edit.evict(gone), at=at)
    for layer in range(lm.layers):
        local = windows(lm)[layer] is not None
        assert bool(torch.all(result.heads["rho"][layer] == 0)) == local
        assert bool(torch.all(result.heads["delta_isolated"][layer] == 0)) == local
    if lm.config.model_type == "mistral":  # every layer windowed: the step is computed exactly as before
        assert result.next_token.kl == 0
    assert result.detail.outside == [slot < at - WINDOW + 1 for slot in range(at + 1)]


def test_a_windowed_layers_bytes_stop_growing_at_the_window(windowed):
    lm, _, session = windowed
    layer_bytes = 2 * lm.kv_heads * lm.head_dim * 4  # K and V of one slot in one layer, float32
    for at in (5, WINDOW - 1, WINDOW, 2 * WINDOW, len(session) - 1):
        memory = step_memory(session, Edit(), at)
        held = [at if w is None else min(at, WINDOW - 1) for w in windows(lm)]
        assert memory.layer_slots == held
        assert memory.full_bytes == sum(held) * layer_bytes
    late = [step_memory(session, Edit(), at).full_bytes for at in range(WINDOW, len(session))]
    if lm.config.model_type == "mistral":
        assert len(set(late)) == 1
    else:  # the global layer keeps growing
        assert late == sorted(late) and late[0] < late[-1]
