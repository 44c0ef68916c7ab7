"""Export → import restores the conversation, commits and draft, and the restored session computes the same."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.session import Session
from kvviz.session_file import export_session, import_session
from kvviz.whatif import what_if


def test_round_trip_gives_identical_logits_and_edits(lm):
    session = Session(lm)
    session.add_user_turn("Name two planets.")
    session.generate(6)
    session.commit(Edit.evict([3, 4]).merged(Edit.quantize(range(5, 9), 4)))
    session.add_user_turn("And one more?")
    session.generate(5)
    draft = EditDraft()
    draft.toggle_evicted(12)
    draft.set_bits([20, 21], 8, 4)
    document = json.loads(json.dumps(export_session(session, draft, {"layer": 3, "head": 2, "at": None})))
    restored, restored_draft, view = import_session(lm, document)
    assert restored.transcript.ids == session.transcript.ids
    assert [s.position for s in restored.transcript.slots] == [s.position for s in session.transcript.slots]
    assert restored.transcript.segments() == session.transcript.segments()
    assert restored.conversation() == session.conversation() and restored.pending == session.pending
    assert torch.equal(restored.logits, session.logits)
    assert [c.at for c in restored.commits.stack] == [c.at for c in session.commits.stack]
    assert restored_draft.edit() == draft.edit() and view == {"layer": 3, "head": 2, "at": None}
    a, b = what_if(session, draft.edit(len(session) - 1)), what_if(restored, restored_draft.edit(len(restored) - 1))
    assert a.next_token.kl == b.next_token.kl


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="other"), "not a kvviz session"),
    (lambda d: d.update(version=2), "format version"),
    (lambda d: d.pop("turns"), "'turns' is a required property"),
    (lambda d: d["turns"][0].update(prefill_ids=[1, 2, 3]), "another model"),
    (lambda d: d["draft"]["edit"].update(key_bits={"9999": 4}), "beyond the transcript"),
])
def test_foreign_or_malformed_documents_are_refused(lm, mutate, message):
    session = Session(lm)
    session.add_user_turn("Hi")
    session.generate(2)
    document = export_session(session, EditDraft())
    mutate(document)
    with pytest.raises(KvvizError, match=message):
        import_session(lm, document)
