"""A guided tour in the sidebar: the step's caption with the live model's numbers, where to look, and Back / Next /
End, always on screen beside the page, which scrolls to what the step describes (the strip and the what-if, the toy
numbers at the top, or a view tab; a policy run's step opens its run and blame). Each step sets the state it
describes (step, edit, layer and head); it stays live and clickable."""

from __future__ import annotations

import contextlib

import streamlit as st

from app import state
from app.components.scroll import look_at, scroll_here
from app.plain import code, plain
from app.views.whatif import CHARTS
from kvviz.spelling import spell
from kvviz.model import LoadedModel
from kvviz.scenarios import Scenario, toy_example
from kvviz.tours import Tour, load_tours, play, stage


def choose(lm: LoadedModel) -> None:
    """The sidebar's list of tours."""
    st.subheader("Guided tours")
    for index, tour in enumerate(load_tours()):
        if st.button(tour.name, help=tour.description, key=f"tour-{index}"):
            with st.spinner(plain(f"Preparing “{tour.name}”…")):
                go(tour, 0, play(lm, tour))
            st.rerun(scope="app")


def go(tour: Tour, index: int, session) -> None:
    """Show step ``index`` of ``tour`` on ``session``."""
    step = tour.steps[index]
    waiting = st.spinner(plain(f"Running “{step.policy_run}”: the full cache and the policy side by side…")) \
        if step.policy_run else contextlib.nullcontext()  # the demo's two runs take seconds
    with waiting:
        shown = stage(session, step)
    newest = shown.at == len(session) - 1
    kept = list(state.prepared()) if session is state.session() else []  # edits kept for the page stay
    state.replace(session, shown.draft, {"layer": shown.layer, "head": shown.head, "at": None if newest else shown.at,
                                         "prepared": kept})
    toy = None
    if step.toy:
        scenario = Scenario(name="Toy numbers", description="α, ρ and α′ = α/(1−ρ)", toy=step.toy)
        toy = (scenario, [toy_example(step.toy["alpha"], evict) for evict in step.toy["evict"]])
    state.keep("toy", toy)
    state.show_in_views(continuation=step.continuation)  # the what-if shows the continuations the caption quotes
    if step.scroll == "charts":  # the maps the caption talks about, in their tab
        state.show_in_views(chart=CHARTS["heads"])
    look_at(step.scroll or ("top" if step.toy else "views" if step.view or step.channels else "strip"))  # its subject
    if step.policy_run:
        state.keep_policy_run(*shown.policy_run)
    if step.view or step.policy_run:  # opened before the tabs are drawn (app/main.py)
        state.open_view(step.view or "Policy run")
    if step.channels:
        state.show_in_views(channels=step.channels)
    evicted = sorted(shown.draft.edit(shown.at).evicted_slots())  # the strip scrolls to the chip the caption names
    state.keep("tour", {"tour": tour, "index": index, "caption": shown.caption(step, lambda t: code(spell(t))),
                        "look": step.look, "session": session, "focus": evicted[0] if evicted else None})


def render() -> None:
    kept = state.kept("tour")
    if kept is None:
        return
    if kept["session"] is not state.session():  # another conversation was started, imported or restored
        state.keep("tour", None)
        return
    tour, index = kept["tour"], kept["index"]
    with st.sidebar.container(border=True, key="tour"):
        scroll_here(f"{tour.name}/{index}", key="tour-scroll")  # the sidebar brings each step's card into view
        st.markdown(f"**Tour: {plain(tour.name)}** · step {index + 1} of {len(tour.steps)}")
        # above the caption, so they are on screen with the card's top however long it is; one per row: in presentation
        # mode's narrow sidebar three in a row were cut to "B", "N", "E" (and two to "Ba…")
        if st.button("Next", disabled=index == len(tour.steps) - 1, key="tour-next", type="primary", width="stretch"):
            go(tour, index + 1, state.session())
            st.rerun(scope="app")
        if st.button("Back", disabled=index == 0, key="tour-back", width="stretch"):
            go(tour, index - 1, state.session())
            st.rerun(scope="app")
        if st.button("End", key="tour-end", help="End the tour", width="stretch"):
            state.keep("tour", None)
            state.keep("toy", None)
            st.rerun(scope="app")
        st.markdown(kept["caption"])  # the tour file's own Markdown, with the model's numbers
        if kept["look"]:
            st.caption(kept["look"])
