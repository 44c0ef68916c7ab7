"""A fork (kvviz.fork): the conversation re-run from a step with an edit committed there. Reference: one no-cache
forward (eager attention, no kvviz code) of the fork's whole sequence with a float 4D mask in which every row sees
what that step saw — everything before the fork's step, the cache less the evicted slots from it on — reproduces the
fork's logits, and each token the fork chose is that row's argmax wherever its top-2 margin exceeds the rounding."""

from __future__ import annotations

import pytest
import torch

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.fork import fork
from kvviz.whatif import what_if
from tests.support.rounding import logit_rounding

QUESTION = "Answer in Spanish. What colour is the sky?"


def _reference(eager_model, ids: list[int], hidden_from: list[tuple[int, list[int]]]) -> torch.Tensor:
    """Logits ``(n, V)`` of one masked forward: causal, and from row ``r`` on each ``(r, slots)`` hides ``slots``."""
    n = len(ids)
    mask = torch.full((n, n), float("-inf")).triu(1)
    for row, slots in hidden_from:
        mask[row:, slots] = float("-inf")
    with torch.no_grad():
        return eager_model(input_ids=torch.tensor([ids]), attention_mask=mask[None, None], use_cache=False).logits[0]


def _check_choices(lm, child, reference: torch.Tensor, start: int) -> int:
    """Every token the fork chose from row ``start`` on is the reference's argmax where the top-2 margin is over twice
    the logit rounding (a near tie may go either way); returns how many rows that decided."""
    ids = child.transcript.ids + [child.pending]
    decided = 0
    for row in range(start, len(ids) - 1):
        if row + 1 < len(child) and child.transcript.slots[row + 1].kind != "decode":
            continue  # the next token is the prompt's, not a choice
        top = reference[row].topk(2).values
        if top[0] - top[1] > 2 * logit_rounding(lm.config, reference[row]):
            assert int(reference[row].argmax()) == ids[row + 1], row
            decided += 1
    return decided


@pytest.fixture(scope="module")
def parent(make_chat):
    session = make_chat(QUESTION, generate=10)
    session.add_user_turn("And the grass?")
    session.generate(6)
    return session


def test_a_fork_inside_the_prompt_reruns_the_conversation_as_one_masked_forward(lm, eager_model, parent):
    at = next(s.slot for s in parent.transcript.slots if s.kind == "decode") - 1  # the prompt's last: chose the answer
    instruction = list(range(24, 28))  # "Answer in Spanish."
    assert lm.tokenizer.decode(parent.transcript.ids[24:28]).strip() == "Answer in Spanish."
    before = (list(parent.transcript.ids), parent.conversation(), len(parent.commits.stack))
    child, where = fork(parent, at, Edit.evict(instruction), 8)
    assert (list(parent.transcript.ids), parent.conversation(), len(parent.commits.stack)) == before  # untouched
    assert where.at == at and where.turn == 0
    assert child.transcript.ids[: at + 1] == parent.transcript.ids[: at + 1]  # slot at's own token stays
    assert [c.at for c in child.commits.stack] == [at]
    assert [t["user"] for t in child.conversation()] == [QUESTION, "And the grass?"]  # every later message, answered
    assert child.conversation()[0]["assistant"] != parent.conversation()[0]["assistant"]
    ids = child.transcript.ids + [child.pending]
    reference = _reference(eager_model, ids, [(at, instruction)])
    last = reference[len(child) - 1]  # the newest step's row: it chose the pending token
    assert (last - child.logits).abs().max() <= logit_rounding(lm.config, last)
    assert _check_choices(lm, child, reference, at) >= 8
    # with greedy decoding its first tokens are the what-if's edited continuation (where no near tie decides)
    steps = 6  # tokens the fork cached in its reply (a reply cut short is re-read by the next prompt)
    continuation = what_if(parent, Edit.evict(instruction), at=at, continuation=steps).continuation.edited_ids
    margins = [(reference[r].topk(2).values[0] - reference[r].topk(2).values[1]).item() for r in range(at, at + steps)]
    clear = next((i for i, m in enumerate(margins) if m <= 2 * logit_rounding(lm.config, reference[at + i])), steps)
    assert continuation[:clear] == ids[at + 1 : at + 1 + clear] and clear >= 4


def test_a_fork_at_a_decode_step_keeps_the_commits_before_it_and_drops_those_after(lm, eager_model, make_chat):
    session = make_chat(QUESTION, generate=4)
    early = len(session)
    session.commit(Edit.evict([5, 6]))
    session.generate(8)
    at = len(session) - 3
    late = len(session)
    session.commit(Edit.evict([7]))  # made after the fork's step: the other branch's
    session.generate(10)
    child, _ = fork(session, at, Edit.evict([24, 25]), 6)
    assert [c.at for c in child.commits.stack] == [early, at]
    assert child.commits.current.evicted_slots() == {5, 6, 24, 25} and late > at
    assert child.transcript.ids[: at + 1] == session.transcript.ids[: at + 1]
    ids = child.transcript.ids + [child.pending]
    reference = _reference(eager_model, ids, [(early, [5, 6]), (at, [24, 25])])
    last = reference[len(child) - 1]  # the newest step's row: it chose the pending token
    assert (last - child.logits).abs().max() <= logit_rounding(lm.config, last)
    _check_choices(lm, child, reference, at)


def test_a_fork_that_cannot_run_is_refused_and_changes_nothing(parent):
    ids, length = list(parent.transcript.ids), len(parent)
    for at, edit, message in ((5, Edit(), "the edit is empty"), (0, Edit.evict([1]), "after the first"),
                              (length, Edit.evict([1]), "after the first")):
        with pytest.raises(KvvizError, match=message):
            fork(parent, at, edit, 4)
    assert parent.transcript.ids == ids and len(parent) == length
