"""Sessions as JSON: the conversation (exact token ids), committed edits, the draft edit and view settings.

Import replays the conversation on the model — prefill and decode as recorded, commits at the slot counts where
they were made — so the restored session computes what the original computed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from kvviz.edit.draft import EditDraft
from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.sampling import Sampling
from kvviz.session import Session
from kvviz.session_schema import FORMAT, VERSION, CheckedFile, check_file


def export_session(session: Session, draft: EditDraft | None = None, view: dict | None = None) -> dict:
    """A JSON-ready document of ``session`` (plus the dashboard's draft edit and view settings)."""
    if session.released:  # its commits are gone with its tensors: a document of it would lose them
        raise KvvizError(f"this session was released ({session.released}); its last session file holds it")
    turns, slots = [], session.transcript.slots
    for number, (turn, (reply, shown)) in enumerate(zip(session.conversation(), session.replies())):
        prefilled = [s.id for s in slots if s.turn == number and s.kind == "prefill"]
        raw = {"raw": True} if session.messages and _raw(session, number) else {}
        turns.append({"user": turn["user"], "prefill_ids": prefilled, "reply_ids": reply, "shown": shown} | raw)
    document: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "model": session.lm.name, "chat": bool(session.messages),
        "sampling": asdict(session.sampling), "turns": turns,
        "commits": [{"at": c.at, "edit": c.edit.to_dict()} for c in session.commits.stack],
        "view": view or {},
    }
    if draft is not None:
        document["draft"] = {"edit": draft.edit().to_dict(), "policy_name": draft.policy_name,
                             "policy_settings": draft.policy_settings}
    return document


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise KvvizError(f"cannot import this session: {message}")


def import_session(lm: LoadedModel, document: Any, progress: Callable[[int, int], None] | None = None
                   ) -> tuple[Session, EditDraft, dict]:
    """Rebuild a session from :func:`export_session`'s document, which is checked in full first (see
    :mod:`kvviz.session_schema`; once only: a :class:`CheckedFile` for this model's shape is not checked again):
    malformed, foreign or oversized documents are refused before anything runs.

    ``progress(done, total)`` is called after each forward pass with the tokens replayed so far; an exception it
    raises (e.g. the page's Stop) abandons the replay. Either way nothing but the returned session is touched.
    """
    if not (isinstance(document, CheckedFile) and document.geometry == lm.geometry):
        document = check_file(lm.geometry, document.document if isinstance(document, CheckedFile) else document)
    document = document.document
    turns = document["turns"]
    commits = [(c["at"], Edit.from_dict(c["edit"])) for c in document.get("commits", [])]
    saved = document.get("draft")
    draft_edit = None if saved is None else Edit.from_dict(saved["edit"])
    session = Session(lm, Sampling(**document.get("sampling", {})))
    total = sum(len(t["prefill_ids"]) + max(len(t["reply_ids"]) - 1, 0) for t in turns)
    session.check_room(total)  # the memory budget, before hours of replay
    report = progress or (lambda done, total: None)
    for turn in turns:
        apply_due(session, commits)
        if document.get("chat", True):
            delta = session.add_user_turn(turn["user"], turn.get("raw", False))
            _require(delta == turn["prefill_ids"], "its tokens differ from this model's chat template (another model?)")
        else:
            session.add_ids(turn["prefill_ids"])
        report(len(session), total)
        for index, token in enumerate(turn["reply_ids"]):
            if index:
                apply_due(session, commits)
                session.step()
                report(len(session), total)
            session.force(token)
        session.set_announced(turn["shown"])
    apply_due(session, commits)
    _require(not commits, "a committed edit lies beyond the conversation")
    draft = EditDraft()
    if draft_edit is not None:
        draft = EditDraft.from_edit(draft_edit, saved.get("policy_name", ""), saved.get("policy_settings", {}))
        _require(all(s < len(session) for s in draft.edit().touched_slots()),
                 "its edit names slots beyond the transcript")
    return session, draft, dict(document.get("view", {}))


def read_session(lm: LoadedModel, text: str | bytes, progress: Callable[[int, int], None] | None = None
                 ) -> tuple[Session, EditDraft, dict]:
    """:func:`import_session` of a file's text (checked with :func:`~kvviz.session_schema.check_file`)."""
    return import_session(lm, check_file(lm.geometry, text), progress)


def _raw(session: Session, turn: int) -> bool:
    """Whether the user message of ``turn`` was read with raw special tokens."""
    users = [m for m in session.messages if m["role"] == "user"]
    return bool(users[turn].get("raw")) if turn < len(users) else False


def apply_due(session: Session, commits: list[tuple[int, Edit]]) -> None:
    """Commit the recorded commits (``(at, cumulative edit)``, in order) that are due at the session's length."""
    while commits and commits[0][0] == len(session):
        session.commit(_added(commits.pop(0)[1], session.commits.current))


def _added(recorded: Edit, current: Edit) -> Edit:
    """What a recorded commit adds to the edit in force: each commit is stored cumulative (every earlier commit's
    evictions, prunings and merges, then its own), and committing it whole on top of ``current`` would apply the
    earlier merges a second time — a value folded in twice, a file that grows at every save and load. Bit-widths and
    quantizers are the recorded ones (they replace, so repeating them changes nothing)."""
    parts = {}
    for name in ("evictions", "prunings", "merges"):
        mine, earlier = getattr(recorded, name), getattr(current, name)
        _require(mine[:len(earlier)] == earlier, f"a committed edit does not extend the one before it ({name})")
        parts[name] = mine[len(earlier):]
    return replace(recorded, **parts)
