"""A fork: the conversation re-run from one of its steps with an edit committed there, as a new session.

Looking back at the step of slot ``at`` (its query is slot ``at``; it sees slots ``0..at``), the what-if shows what
that step would have done on an edited cache. A fork makes it so: a new session replays the conversation exactly up
to that step (the same passes, the commits made before it), commits the edit, runs the step of slot ``at`` on the
edited cache and goes on from there — the rest of that turn's reply generated afresh, then every later message of the
user prefilled and answered in turn. Slot ``at``'s own token stays (the step before chose it); every token chosen from
the step of ``at`` on may differ. The original session is not touched: the two can be compared side by side.

Inside a prompt the fork splits the prefill at ``at`` (two passes, the same numbers up to float rounding: docs/math.md
§1), so its step of slot ``at`` is the what-if's edited step, and with greedy decoding its first tokens are the
what-if's edited continuation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvviz.edit.edit import Edit
from kvviz.errors import KvvizError
from kvviz.model import LoadedModel
from kvviz.sampling import Sampling
from kvviz.session import Session
from kvviz.session_file import apply_due, export_session


@dataclass(frozen=True)
class Fork:
    """Where a fork left its parent: the step of slot ``at`` (in turn ``turn``), the ``edit`` committed there."""

    at: int
    turn: int
    edit: Edit

    def describe(self) -> str:
        return f"forked at the step of slot {self.at} (turn {self.turn + 1})"


def check(session: Session, at: int, edit: Edit) -> None:
    """Refuse a fork that cannot run (see :func:`fork`), before any work."""
    if edit.is_empty:
        raise KvvizError("the edit is empty: a fork re-runs the conversation on an edited cache")
    if not 0 < at < len(session):
        raise KvvizError(f"a fork starts at the step of a cached slot after the first (1 to {len(session) - 1}), "
                         f"not {at}")
    if not session.messages:
        raise KvvizError("a fork re-runs the user's messages through the chat template; this conversation was "
                         "started from raw token ids")


def fork(session: Session, at: int, edit: Edit, max_new_tokens: int,
         progress: Callable[[int, int], None] | None = None) -> tuple[Session, Fork]:
    """A new session: ``session`` replayed up to the step of slot ``at``, ``edit`` committed before that step, and the
    conversation re-run from there (each reply up to ``max_new_tokens`` tokens or its end of turn). Commits made after
    that step belong to the other branch and are left out. ``progress(done, total)`` counts the replayed tokens.
    Refuses an empty edit, a slot outside the conversation, or a conversation without the chat template (raw ids)."""
    check(session, at, edit)
    document = export_session(session)
    child = Session(session.lm, Sampling(**document["sampling"]))
    child.check_room(len(session))
    commits = [(c["at"], Edit.from_dict(c["edit"])) for c in document["commits"] if c["at"] <= at]
    report = progress or (lambda done, total: None)
    turns, start, forked = document["turns"], 0, None
    for number, turn in enumerate(turns):
        apply_due(child, commits)
        prompt = range(start, start + len(turn["prefill_ids"]))
        if forked is not None:  # after the fork: the user's message, answered afresh
            child.add_user_turn(turn["user"], turn.get("raw", False))
            child.generate(max_new_tokens)
            continue
        if at in prompt:  # the fork is inside this prompt: its prefill splits there (or all of it runs edited)
            forked = Fork(at, number, edit)
            if at == prompt.start:
                child.commit(edit)
                _replayed(child.add_user_turn(turn["user"], turn.get("raw", False)), turn)
            else:
                _replayed(child.add_user_turn(turn["user"], turn.get("raw", False),
                                              commit_after=(at - prompt.start, edit)), turn)
            report(len(child), len(session))
            child.generate(max_new_tokens)
            continue
        _replayed(child.add_user_turn(turn["user"], turn.get("raw", False)), turn)
        report(len(child), len(session))
        reply = turn["reply_ids"]
        for index, token in enumerate(reply):
            if index:
                apply_due(child, commits)
                child.step()
                report(len(child), len(session))
            child.force(token)
            if len(child) == at:  # the step of slot ``at`` is next: it and the rest of the turn run edited
                forked = Fork(at, number, edit)
                apply_due(child, commits)
                child.commit(edit)
                child.set_announced(index + 1)
                child.generate(max_new_tokens)
                break
        else:
            child.set_announced(turn["shown"])
        start = prompt.stop + len(reply) - 1 if reply else prompt.stop
    if forked is None:
        raise KvvizError(f"slot {at} is the newest step's pending token: commit there instead of forking")
    return child, forked


def _replayed(ids: list[int], turn: dict) -> None:
    """A replayed prompt must be the recorded one, token for token: the fork's step is found by counting them."""
    if ids != turn["prefill_ids"]:
        raise KvvizError("the conversation's prompts no longer read as they did (another chat template?): cannot "
                         "replay it to fork")


def conversation_of(lm: LoadedModel, document: dict) -> list[dict[str, str]]:
    """The turns of a session document (:func:`~kvviz.session_file.export_session`) as ``{"user", "assistant"}``,
    each reply as its session showed it (the shown tokens, end of turn left out): a branch kept as a document is
    compared without replaying it."""
    turns = []
    for turn in document["turns"]:
        ids = [i for i in turn["reply_ids"][: turn["shown"]] if i not in lm.stop_ids]
        turns.append({"user": turn["user"], "assistant": lm.tokenizer.decode(ids, skip_special_tokens=True)})
    return turns
