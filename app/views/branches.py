"""Branches of the conversation: a fork (kvviz.fork) re-runs the conversation from a step looked back at; the branch it
left is kept — as a session document, replayed when chosen — to compare with side by side and to return to."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import state
from app.components.scroll import look_at, mark
from app.long_work import Work, hand_over
from app.plain import plain, warn
from kvviz.errors import KvvizError
from kvviz.fork import Fork, conversation_of
from kvviz.session import Session
from kvviz.session_file import import_session
from kvviz.session_schema import check_file


def fork_name(at: int) -> str:
    """A new branch's name, ``fork at step N`` (numbered when that name is taken)."""
    taken = {state.branch(), *(b["name"] for b in state.branches())}
    name, number = f"fork at step {at}", 2
    while name in taken:
        name, number = f"fork at step {at} ({number})", number + 1
    return name


def forked(result: tuple[Session, Fork], name: str) -> None:
    """Show the fork the page's run made; the branch it left is kept."""
    child, where = result
    left = state.branch()
    state.fork_to(child, name)
    look_at("branches")  # the kept branch and the new one's replies side by side, where the page would not be
    state.notify(f"You are on the branch {name}: the conversation {where.describe()}, run again on the edited cache "
                 f"from there. The branch {left} is kept under Branches, below the committed edits.", note=True)


def render() -> None:
    """The kept branches: each with its replies beside this branch's and a button that switches to it."""
    others = state.branches()
    if not others:
        return
    session = state.session()
    ours = session.conversation()
    mark("branches")
    with st.container(border=True, key="branches"):
        st.markdown(f"**Branches** — this one is *{plain(state.branch())}*")
        for index, other in enumerate(others):
            name, document = other["name"], other["document"]
            text, button = st.columns([5, 1], vertical_alignment="center")
            theirs = conversation_of(session.lm, document)
            text.text(f"{name} · {len(theirs)} turn{'s' * (len(theirs) != 1)}")
            if button.button("Switch", key=f"branch-{index}", help=f"Replays {name} and shows it; this branch is kept"):
                _switch(index, document)
            with st.expander(f"Side by side with {name}"):
                rows = [{"turn": n + 1, "user": (ours[n] if n < len(ours) else theirs[n])["user"],
                         state.branch(): ours[n]["assistant"] if n < len(ours) else "",
                         name: theirs[n]["assistant"] if n < len(theirs) else ""}
                        for n in range(max(len(ours), len(theirs)))]
                st.dataframe(pd.DataFrame(rows), hide_index=True)


def _switch(index: int, document: dict) -> None:
    lm = state.session().lm
    try:
        checked = check_file(lm.geometry, document)  # checked once: the replay does not check it again
        state.make_room(checked.tokens)
    except KvvizError as exc:
        warn(exc)
        return
    hand_over(Work(f"Replaying the branch {state.branches()[index]['name']}",
                   lambda progress: import_session(lm, checked, progress),
                   lambda result: state.switch_branch(index, result[0], result[1])))
