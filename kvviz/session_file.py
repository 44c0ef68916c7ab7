"""Sessions as JSON: the conversation (exact token ids), committed edits, the draft edit and view settings.

Import replays the conversation on the model — prefill and decode as recorded, commits at the slot counts where
they were made — so the restored session computes what the original computed.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from kvviz.draft import EditDraft
from kvviz.edits import Edit
from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.sampling import Sampling
from kvviz.session import Session

FORMAT, VERSION = "kvviz-session", 1


def export_session(session: Session, draft: EditDraft | None = None, view: dict | None = None) -> dict:
    """A JSON-ready document of ``session`` (plus the dashboard's draft edit and view settings)."""
    turns, slots = [], session.transcript.slots
    for number, (turn, (reply, shown)) in enumerate(zip(session.conversation(), session.replies())):
        prefilled = [s.id for s in slots if s.turn == number and s.kind == "prefill"]
        turns.append({"user": turn["user"], "prefill_ids": prefilled, "reply_ids": reply, "shown": shown})
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


def import_session(lm: LoadedModel, document: Any) -> tuple[Session, EditDraft, dict]:
    """Rebuild a session from :func:`export_session`'s document; malformed or foreign documents are refused."""
    _require(isinstance(document, dict) and document.get("format") == FORMAT, "it is not a kvviz session file")
    _require(document.get("version") == VERSION, f"format version {document.get('version')!r} is not {VERSION}")
    try:
        turns = [(str(t["user"]), [int(i) for i in t["prefill_ids"]], [int(i) for i in t["reply_ids"]],
                  int(t["shown"])) for t in document["turns"]]
        commits = [(int(c["at"]), Edit.from_dict(c["edit"])) for c in document.get("commits", [])]
        session = Session(lm, Sampling(**document.get("sampling", {})))
    except (KeyError, TypeError, ValueError) as exc:
        raise KvvizError(f"cannot import this session: missing or malformed field ({exc})") from exc
    for user, prefill, reply, shown in turns:
        _apply_due(session, commits)
        if document.get("chat", True):
            delta = session.add_user_turn(user)
            _require(delta == prefill, "its tokens differ from this model's chat template (another model?)")
        else:
            session.add_ids(prefill)
        for index, token in enumerate(reply):
            if index:
                _apply_due(session, commits)
                session.step()
            session.force(token)
        session.set_announced(shown)
    _apply_due(session, commits)
    _require(not commits, "a committed edit lies beyond the conversation")
    draft = EditDraft()
    if "draft" in document:
        saved = document["draft"]
        draft = EditDraft.from_edit(Edit.from_dict(saved["edit"]), saved.get("policy_name", ""),
                                    saved.get("policy_settings", {}))
        _require(all(s < len(session) for s in draft.evicted_somewhere() | set(draft.key_bits)),
                 "its edit names slots beyond the transcript")
    return session, draft, dict(document.get("view", {}))


def _apply_due(session: Session, commits: list[tuple[int, Edit]]) -> None:
    while commits and commits[0][0] == len(session):
        session.commit(commits.pop(0)[1])  # cumulative edits: committing the recorded one reproduces it
