"""A guided tour: the sidebar's list of tours, and the card of the step being shown — its caption with the live
model's numbers, where to look, and Next / Back / End — docked at the bottom of the page in the chat box's place (the
box gives way until the tour ends), as wide as the page beside the sidebar, open or folded. The page scrolls to what
the step describes (the strip and the what-if, the toy numbers at the top, or a view tab; a policy run's step opens
its run and blame), so the caption, its buttons and its subject share one screen, a 1280×720 projector's included.
Each step sets the state it describes (step, edit, layer and head); it stays live and clickable."""

from __future__ import annotations

import contextlib

import streamlit as st

from app import state
from app.components.scroll import look_at
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


# The card (its layout wrapper, whose parent is the page's column) sticks to the bottom of the page's view (it is drawn
# last, so it is never below its place) and takes the chat box's place. Its type stays at the page's normal size in
# presentation mode (in px: that mode scales the rem), where a caption of 400 characters then takes four or five lines
# of the card's width instead of a screen and a half of the sidebar's; the card stays low (~150 px) so that the numbers
# and the strip above it stay in view.
DOCKED = """<style>
[data-testid=stBottom] {{display: none;}}
[data-testid=stLayoutWrapper]:has(> .st-key-tour) {{position: sticky; bottom: 0.75rem; z-index: 99; flex-shrink: 0;}}
.st-key-tour > * {{flex-shrink: 0;}}
.st-key-tour {{background: {background}; box-shadow: 0 -0.4rem 1rem {shadow};
  padding: 10px 16px !important; gap: 6px !important;}}
.st-key-tour p, .st-key-tour li, .st-key-tour code, .st-key-tour label {{font-size: 15px !important;
  line-height: 1.45 !important;}}
.st-key-tour [data-testid=stCaptionContainer] p {{font-size: 13px !important;}}
.st-key-tour button {{min-height: 34px !important; padding: 2px 10px !important;}}
</style>"""


def _move(tour: Tour, index: int) -> None:
    """A card button's callback: show step ``index`` before the page is drawn again (one run per click)."""
    go(tour, index, state.session())


def _end() -> None:
    state.keep("tour", None)
    state.keep("toy", None)


def render() -> None:
    """The card of the step being shown (drawn last on the page: see :data:`DOCKED`)."""
    kept = state.kept("tour")
    if kept is None:
        return
    if kept["session"] is not state.session():  # another conversation was started, imported or restored
        state.keep("tour", None)
        return
    tour, index = kept["tour"], kept["index"]
    dark = st.context.theme.type == "dark"
    st.html(DOCKED.format(background="#0e1117" if dark else "#ffffff",
                          shadow="rgba(0, 0, 0, 0.6)" if dark else "rgba(49, 51, 63, 0.15)"))
    with st.container(border=True, key="tour"):
        heading, back, forward, end = st.columns([4, 1, 1, 1], vertical_alignment="center")
        heading.markdown(f"**Tour: {plain(tour.name)}** · step {index + 1} of {len(tour.steps)}")
        back.button("Back", disabled=index == 0, key="tour-back", width="stretch", on_click=_move,
                    args=(tour, index - 1))
        forward.button("Next", disabled=index == len(tour.steps) - 1, key="tour-next", type="primary",
                       width="stretch", on_click=_move, args=(tour, index + 1))
        end.button("End", key="tour-end", help="End the tour", width="stretch", on_click=_end)
        st.markdown(kept["caption"])  # the tour file's own Markdown, with the model's numbers
        if kept["look"]:
            st.caption(kept["look"])
