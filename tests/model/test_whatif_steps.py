"""Where an edit matters (kvviz.whatif.steps) on the real bundled model: every step of the turn re-run in batched
passes equals the what-if of that step, and a physically removed cache; the full side is the step the session ran."""

from __future__ import annotations

import pytest

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.scenarios import find_slots
from kvviz.session import Session
from kvviz.whatif import what_if
from kvviz.whatif.metrics import kl_divergence
from kvviz.whatif.steps import kept_effects, step_effects, turn_steps, unsaid_words
from tests.support.references import removed_step
from tests.support.rounding import kl_rounding

PROMPT = "My cat is called Whiskers and my dog is called Rex. What is my dog called?"


@pytest.fixture(scope="module")
def chat(make_chat) -> Session:
    return make_chat(PROMPT, generate=10)


def test_the_steps_are_the_query_end_and_every_generated_slot(chat):
    steps = turn_steps(chat)
    prefilled = [slot.slot for slot in chat.transcript.slots if slot.kind == "prefill"]
    assert steps[0] == prefilled[-1]
    assert steps[1:] == list(range(prefilled[-1] + 1, len(chat)))


def test_the_full_side_is_the_step_the_session_ran(chat):
    """Greedy decoding: each step's full top-1 is the token the session chose there (the next slot, then the pending
    one) — the batched rows see what each step saw, at its position."""
    effects = step_effects(chat, Edit())
    assert [step.top1_full for step in effects.steps] == [step.chose for step in effects.steps]
    assert all(step.kl == 0 and not step.flips for step in effects.steps)
    assert effects.worst is None


def test_each_step_equals_its_what_if_and_a_removed_cache(chat, eps):
    """An eviction of the dog's name: at every step the batched KL equals the what-if of that step and the KL of a
    step run on a cache the slots were physically removed from, within the rounding of two summation orders of the
    logits (kl_rounding: both logit vectors off by at most ε per entry; the batch changes the order, not the
    arithmetic)."""
    evicted = find_slots(chat, " Rex")
    assert evicted
    edit = Edit.evict(evicted)
    effects = step_effects(chat, edit)
    for step in effects.steps:
        alone = what_if(chat, edit, at=step.slot, topk=2).next_token
        assert abs(step.kl - alone.kl) <= kl_rounding(eps, alone.kl), step
        full, removed = removed_step(chat, step.slot, []), removed_step(chat, step.slot, evicted)
        reference = float(kl_divergence(full, removed))
        assert abs(step.kl - reference) <= kl_rounding(eps, reference), step
        if alone.edited[0].prob - alone.edited[1].prob > 1e-3:  # not a near tie
            assert step.top1_edited == alone.edited[0].id
    worst = effects.worst
    assert worst is not None and worst.kl == max(step.kl for step in effects.steps)
    assert worst.kl > effects.steps[-1].kl  # the newest step is not where the eviction matters


def test_a_committed_eviction_is_the_full_side(make_chat, lm, eps):
    """An eviction committed after three steps: the steps after it saw it, so their full side hides it too and still
    chooses what the session chose; an edit on top equals each step's what-if (whose full run is the committed
    cache)."""
    session = make_chat(PROMPT)
    for _ in range(3):
        session.step()
    session.commit(Edit.evict(find_slots(session, " Whiskers")))
    session.generate(4)
    empty = step_effects(session, Edit())
    assert [step.top1_full for step in empty.steps] == [step.chose for step in empty.steps]
    edit = Edit.evict(find_slots(session, " Rex"))
    for step in step_effects(session, edit).steps:
        alone = what_if(session, edit, at=step.slot, topk=1).next_token
        assert step.top1_full == alone.full[0].id
        assert abs(step.kl - alone.kl) <= kl_rounding(eps, alone.kl), step


def test_rewrites_take_the_what_if_and_bad_steps_are_refused(chat):
    edit = Edit(key_bits={slot: 2 for slot in find_slots(chat, " Rex")})
    steps = turn_steps(chat)[:2]
    effects = step_effects(chat, edit, steps)
    for step in effects.steps:
        alone = what_if(chat, edit, at=step.slot, topk=1).next_token
        assert (step.kl, step.top1_edited) == (alone.kl, alone.edited[0].id)
    with pytest.raises(KvvizError, match="cached slots"):
        step_effects(chat, edit, [len(chat)])


def test_the_turn_s_effects_are_kept_until_the_cache_changes(make_chat):
    chat = make_chat(PROMPT, generate=10)  # a copy of its own: this one is committed to
    edit = Edit.evict(find_slots(chat, " Rex"))
    assert kept_effects(chat, edit) is None  # nothing is run to peek
    found = step_effects(chat, edit)
    assert kept_effects(chat, edit) is found and kept_effects(chat, Edit.evict([1])) is None
    chat.commit(Edit.evict([2]))  # the cache changes: what was kept is for another cache
    assert kept_effects(chat, edit) is None


def test_each_step_ranks_the_evicted_word_as_a_removed_cache_does(chat, eps):
    """The evicted word's rank at each step, on both sides, is its rank under a step run on the full cache and on one
    the slots were physically removed from: the tokens with a larger logit, up to those within the two summation
    orders' rounding of it (2ε: both logit vectors off by at most ε per entry), which may count either way. Where
    the edit matters most, the name falls (the issue's first experiment: the top-1 stays, " Rex" drops)."""
    evicted = find_slots(chat, " Rex")
    rex = chat.transcript.slots[evicted[0]].id
    effects = step_effects(chat, Edit.evict(evicted))
    for step in effects.steps:
        assert step.fact == rex, step
        full, removed = removed_step(chat, step.slot, []), removed_step(chat, step.slot, evicted)
        for rank, logits in ((step.fact_rank_full, full), (step.fact_rank_edited, removed)):
            z = logits[rex]
            above, near = int((logits > z + 2 * eps).sum()), int(((logits - z).abs() <= 2 * eps).sum()) - 1
            assert above <= rank <= above + near, (step, above, near)
    worst = effects.worst
    assert worst.fact_rank_edited > worst.fact_rank_full


def test_a_reply_that_never_says_the_evicted_fact_is_named(chat, make_chat):
    """Asked which breed the dog is, the bundled model answers without the name: evicting " Rex" is named as a fact
    the reply never said. Where the reply says the name (the module's chat), or the edit evicts nothing, or no reply
    was written yet, nothing is named."""
    session = make_chat("My dog is called Rex and he is three years old. What breed is my dog?", generate=12)
    assert "rex" not in session.reply.casefold()
    assert unsaid_words(session, Edit.evict(find_slots(session, " Rex"))) == ["Rex"]
    assert "Rex" in chat.reply and unsaid_words(chat, Edit.evict(find_slots(chat, " Rex"))) == []
    assert unsaid_words(session, Edit()) == []
    assert unsaid_words(make_chat("My dog is called Rex. What is my dog called?"), Edit.evict([3])) == []  # no reply
