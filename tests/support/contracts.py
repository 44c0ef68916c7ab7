"""Contracts a type checker reads (tests/process/test_types.py runs mypy on this file; nothing here runs): each
function is well typed only where the class satisfies the protocol it is returned as."""

from __future__ import annotations

from kvviz.edit.commits import CommitLog, Commits
from kvviz.runs.timeline import Timeline
from kvviz.session import Session


def a_session_log_is_commits(log: CommitLog) -> Commits:
    return log


def a_run_timeline_is_commits(timeline: Timeline) -> Commits:
    return timeline


def a_compressed_session_reads_its_timeline(session: Session, timeline: Timeline) -> None:
    session.commits = timeline  # what kvviz.runs.compressed does
