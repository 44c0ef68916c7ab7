"""What-if, side by side: the full cache vs the edited cache at the current step."""

from __future__ import annotations

import streamlit as st

from app import state
from app.components.scroll import mark, scroll_here
from app.long_work import Work, hand_over
from app.views import branches
from app.plain import code, warn
from app.views.slide_download import FORMATS, download
from app.views.token_strip import apply_quantizers
from kvviz import figures
from kvviz.errors import KvvizError
from kvviz.fork import check as fork_check, fork
from kvviz.spelling import spell
from kvviz.figures.slides import whatif_slides
from kvviz.figures.standalone_page import MAX_PREPARED, MAX_SLOTS, Prepared, page_data, standalone_html
from kvviz.view_data import strip_chips
from kvviz.whatif import StepEffect, WhatIf, kept_effects, step_effects, turn_steps, unsaid_words, what_if

PROB = st.column_config.ProgressColumn("p", format="%.4f", min_value=0.0, max_value=1.0)
PRESENTED = 5  # top-k rows in presentation mode


def compute() -> WhatIf:
    """The what-if of the draft at the current step, kept in the session's memo (the last one: the editor's runs of a
    click read it twice); so is a refusal (:class:`KvvizError`, raised again from the memo)."""
    session, at = state.session(), state.step_slot()
    topk, continuation = int(st.session_state.topk), int(st.session_state.continuation)
    layer, head = st.session_state.layer, state.detail_head()
    edit = state.draft().edit(at)

    def run() -> WhatIf | KvvizError:
        try:
            return what_if(session, edit, at=at, layer=layer, head=head, topk=topk, continuation=continuation)
        except KvvizError as exc:
            return exc

    result = session.memoized("whatif", (edit.key, at, layer, head, topk, continuation), run, keep=1)
    if isinstance(result, KvvizError):
        raise result
    state.keep_detail(result.detail)  # the strip's reasons read it (sparse selection)
    return result


def prepare() -> None:
    """Compute the what-if before anything of the editor is drawn. The page then receives the strip and the results
    in one burst after it: each element sent while the step runs makes the browser re-render the page, and on a
    small machine that drawing competes with the step for the same cores (measured at 2k slots: ~0.2 s of browser
    work during the step). A failure is shown where the results go, by :func:`render`."""
    if len(state.session()) >= 2 and apply_quantizers() is None:
        try:
            compute()
        except KvvizError:
            pass


def summary() -> None:
    """The headline numbers (or why there are none). The editor sends them before the strip drawn above them: a
    click's numbers then follow a handful of messages instead of ~45 (the strip, its picker and the options)."""
    if len(state.session()) < 2:
        st.info("Send a message first: the what-if re-runs a step on the cache before it.")
        return
    if apply_quantizers() is not None:  # said once, in the quantizer settings below
        st.caption("No what-if while the quantizer settings do not fit the model (see Quantizer settings).")
        return
    try:
        result = compute()
    except KvvizError as exc:
        warn(exc)
        return
    _summary(result)


def render() -> None:
    """Everything below the headline numbers (see :func:`summary`): the top-k tables, then the rest."""
    tables()
    rest()


def tables() -> None:
    """The two top-k tables (in presentation mode a plain table of five rows that scales with the type)."""
    if len(state.session()) < 2:
        return
    try:
        result = compute()
    except KvvizError:
        return  # summary() said why
    large = st.session_state.large
    full, edited = st.columns(2)
    for column, side in ((full, "full"), (edited, "edited")):
        frame = figures.topk_frame(result.next_token, side)
        if large:  # five rows, no heading: the strip, the numbers and both tables on one 1280×720 screen
            frame = frame.head(PRESENTED).rename(columns={"token": f"{side} cache", "rank other": "other"})
            column.table(frame.style.format({"p": "{:.3f}", "Δlogit": "{:+.3f}"}).hide(axis="index"))
        else:
            column.markdown(f"**{side.capitalize()} cache** — next token after slot {result.at}")
            column.dataframe(frame, hide_index=True,
                             column_config={"p": PROB, "Δlogit": st.column_config.NumberColumn(format="%+.4f")})
    if large and st.session_state.topk > PRESENTED:
        st.caption(f"Presentation mode shows the top {PRESENTED} of {st.session_state.topk}.")
    if large:
        _where(result)


CHARTS = {"heads": "ρ and ‖Δo‖ per head", "alpha": "Weights α, α′ of one head", "hidden": "Hidden-state change"}
CAPTIONS = {
    "alpha": "α: the step's attention weights with the full cache · α′ = α/(1−ρ): the same weights renormalized over "
             "what is left (the closed form) · edited: what the edited run really used (they differ when quantized "
             "keys move the scores) · layer {layer}, head {head}{mean}",
    "heads": "ρ: evicted attention mass per layer and query head · ‖Δo‖ isolated: how much the head's output moves "
             "when only its own cache is edited (the full run's query) · propagated: how much it moves in the edited "
             "run, where earlier layers changed too · click a cell of ρ to open that layer and head (now layer "
             "{layer}, head {head})",
    "hidden": "How far the edited run's hidden state is from the full run's after each layer: how the edit "
              "propagates through the model"}


def rest() -> None:
    """Below the tables: top-k and continuation settings, the continuations, the charts, the downloads, the
    buttons."""
    session = state.session()
    if len(session) < 2:
        return
    options = st.columns([1, 1, 3])
    options[0].number_input("Top-k", 1, 50, key="topk")
    options[1].number_input("Continue N tokens", 0, 64, key="continuation", help="Greedy continuations with both "
                            "caches (each token is one more decode step per click)")
    try:
        result = compute()
    except KvvizError:
        return
    if result.continuation:  # right below the next-token tables they continue
        _continuation(result)
    texts = [s.text for s in session.transcript.slots[: result.at + 1]]
    charts = {"alpha": lambda: figures.alpha_chart(result.detail, texts),
              # presentation mode's larger type: narrower maps, so the three fit the column beside the sidebar
              "heads": lambda: figures.head_grid_chart(result.heads, 130 if st.session_state.large else 200),
              "hidden": lambda: figures.hidden_chart(result.hidden_delta)}
    # one chart drawn at a time: the others are made only when their tab is chosen (a click on the strip redraws
    # what is shown, and at 8k slots a chart cost the browser 0.05-0.15 s of every click)
    mark("charts")  # a tour step about the ρ / ‖Δo‖ maps
    tabs = st.tabs(list(CHARTS.values()), key="whatif_chart", on_change="rerun")
    for tab, name in zip(tabs, CHARTS):
        if not tab.open:
            continue
        with tab:
            mean = " (α is one head's: with the mean of heads chosen above, head 0's; choose a head, or click a " \
                "cell of ρ)" if state.head() is None else ""
            st.caption(CAPTIONS[name].format(layer=result.detail.layer, head=result.detail.head, mean=mean))
            chart = charts[name]()
            st.vega_lite_chart(chart.data, chart.spec, key=name, width="content" if name == "heads" else "stretch",
                               on_select=_pick_cell if name == "heads" else "ignore")
    st.download_button("Download these figures (HTML, works offline)",  # built when clicked
                       lambda: figures.figures_html([make() for make in charts.values()],
                                                    f"kvviz what-if at slot {result.at}"),
                       file_name=f"kvviz-whatif-slot{result.at}.html", mime="text/html", on_click="ignore")
    _slides(result)
    _buttons()
    _standalone(result)


def _slides(result: WhatIf) -> None:
    """One figure of this what-if for a slide (light theme, captioned with model, step and edit), rendered offline."""
    session, draft = state.session(), state.draft()
    layer, head, shading = st.session_state.layer, state.head(), st.session_state.get("shading", "linear")
    figure, kind, button = st.columns([2, 2, 3], vertical_alignment="bottom")
    name = figure.selectbox("Figure for a slide", ["strip", "next-token tables", "attention weights (α, α′)",
                                                   "ρ and Δo maps", "hidden-state change"], key="slide_figure")
    chosen = kind.selectbox("Format", list(FORMATS), key="slide_format")

    def spec() -> dict:  # built when the button is pressed
        chips = strip_chips(session, draft, result.at, layer, head, shading)
        return whatif_slides(result, chips, session.lm.name)[name]

    download(button, "Download the figure", spec, f"kvviz-{name.split()[0]}-slot{result.at}", chosen)


def _pick_cell() -> None:
    """A click on a cell of the ρ map: that layer and head become the ones every view shows."""
    cells = st.session_state["heads"].selection.get("cell") or []
    cell = cells[0] if cells and isinstance(cells[0], dict) else {}
    layer, head, lm = cell.get("layer"), cell.get("head"), state.session().lm
    if isinstance(layer, int) and isinstance(head, int) and 0 <= layer < lm.layers and 0 <= head < lm.heads:
        state.choose_head(layer, head)  # anything else (a tampered page) is ignored; every view shows them


def _summary(result: WhatIf) -> None:
    nt, memory = result.next_token, result.memory
    row = st.container(horizontal=True)  # one block, not six as st.columns(5): the numbers reach the page sooner
    row.metric("KL(full‖edited), nats", f"{nt.kl:.3g}", help="How far the edited cache's next-token distribution "
               "is from the full cache's: Σ p log(p/q), 0 when nothing changed")
    row.metric("Total variation", f"{nt.tv:.3g}", help="Half the summed absolute difference of the two next-token "
               "distributions: the probability mass that moved (0 to 1)")
    row.metric("Top-1", "FLIPS" if nt.top1_changed else "unchanged", help="Whether the most likely next token changed")
    layer, head = result.detail.layer, state.head()  # the head the strip shows, or the mean of the layer's heads
    shown = "mean of heads" if head is None else f"head {head}"
    row.metric(f"ρ (layer {layer}, {shown})", f"{result.rho(layer, head):.4f}",
               help=f"Evicted mass: the share of layer {layer}, {shown}'s attention that went to the evicted slots "
                    "(the mean over the layer's query heads of each one's share, with the Head picker's mean); the "
                    "rest is rescaled by 1/(1−ρ). Choose a head above for one head's.")
    sink = result.sink(layer, head)
    if sink is not None:
        row.metric(f"Sink (layer {layer}, {shown})", f"{sink[1]:.4f}", f"{sink[1] - sink[0]:+.4f} vs {sink[0]:.4f}",
                   delta_color="off", help="This model's learned attention sink: a logit per head with no value in "
                   "the softmax's denominator, the share of attention that goes nowhere. Evicting slots leaves it "
                   "the same logit, so its share grows to α_sink/(1−ρ) as the rest does")
    if result.detail.unread:  # sparse selection: the read set the edit changed
        admitted = [slot for slot, new in enumerate(result.detail.admitted) if new]
        row.metric(f"Read anew (layer {layer})", len(admitted), help="This model's indexer picks the slots each step "
                   "reads (DeepSeek sparse attention). With the edit, it picked these slots the full step did not "
                   "read: " + (", ".join(map(str, admitted)) or "none") + ". They take some of the attention, so the "
                   "edited weights differ from α/(1−ρ) (the detail shows both)")
    saved = 1 - memory.edited_bytes / max(memory.full_bytes, 1)
    large = st.session_state.large  # presentation mode: the saving in the label, the numbers on one line
    smaller = f"{saved:.1%}" != "0.0%"  # an edit that saves nothing (or rounds to nothing) shows no "↓ -0.0%"
    label = f"Cache bytes (−{saved:.1%})" if large and smaller else "Cache bytes" if large else \
        "Cache bytes before this step"
    delta = None if large else f"-{saved:.1%} vs {memory.full_bytes:,}" if smaller else \
        f"as the full cache ({memory.full_bytes:,})"
    row.metric(label, f"{memory.edited_bytes:,}", delta, delta_color="off", delta_arrow="auto" if smaller else "off",
               help="K and V of the slots this step reads (before its own is added), packed as the "
               "edit stores them, against the full cache at the model's dtype; sliding-window layers count only "
               "what they hold")
    if not large:  # presentation mode: below the tables (the numbers, the strip and the tables fill one screen)
        _where(result)


def _where(result: WhatIf) -> None:
    """Where the edit matters most among the newest turn's steps, beside this step's numbers, and a way there: the
    newest step often chose the end of the turn whichever cache it had, while the step that chose the answer flips.
    Asked for with a button (a pass over the reply costs about a forward of its length; a click stays one step)."""
    session = state.session()
    edit = state.draft().edit(len(session))
    steps = turn_steps(session)
    if edit.is_empty or not steps:
        return
    if unsaid := unsaid_words(session, edit):  # the first experiment that looks harmless: say why, plainly
        st.info(f"The reply never says {', '.join(code(spell(word)) for word in unsaid)}: it answered without "
                "repeating this fact, so its newest step may barely notice the eviction. The step that chose the "
                "answer may still have read it — ask below where the edit matters most.")
    found = kept_effects(session, edit)
    if found is None:
        asked = st.empty()  # the button gives way to its answer in the same run
        if not asked.button(f"Where does this edit matter most? (re-runs the reply's {len(steps)} steps)",
                            key="find-worst", help="Each step of the reply with the full and the edited cache, as "
                                                   "the what-if runs one: its KL and top-1, and where KL is largest"):
            return
        asked.empty()
        try:
            found = step_effects(session, edit)
        except KvvizError as exc:
            warn(exc)
            return
    worst = found.worst
    if worst is None:
        st.caption(f"This edit changes none of the {len(found.steps)} steps of the newest reply.")
        return
    here = next((step for step in found.steps if step.slot == result.at), None)
    if worst.slot == result.at:
        st.caption(f"Of the {len(found.steps)} steps of the newest reply, this one is where the edit matters most.")
        return
    scroll_here(f"worst-{worst.slot}-{worst.kl}", key="scroll-worst")  # the answer and its button come into view
    text, button = st.columns([4, 1], vertical_alignment="center")
    text.markdown(f"**Matters most at step {worst.slot}**, which chose {_token(worst.chose)}: {_effect_words(worst)}"
                  f" (KL {worst.kl:.3g} nats" + ("" if here is None else f"; here, step {result.at}: {here.kl:.3g}")
                  + ")")
    if button.button(f"Look at step {worst.slot}", key="look-at-worst",
                     help="Time travel to that step: the what-if re-runs it with this edit (the edit stays as it is)"):
        state.travel(None if worst.slot == len(session) - 1 else worst.slot)
        st.rerun()  # the whole page: every view shows that step


def _token(id_: int) -> str:
    """A token of the session's model as a code span (model text renders as it is)."""
    return code(spell(state.session().piece(id_)))


def _effect_words(step: StepEffect) -> str:
    """What the edit does at ``step``, in words: its top-1 change, then the rank of the evicted token it reads."""
    said = f"the top-1 becomes {_token(step.top1_edited)}" if step.flips else "the top-1 stays"
    if step.fact is None or step.fact_rank_full == step.fact_rank_edited:
        return said
    moved = "falls" if step.fact_rank_edited > step.fact_rank_full else "rises"
    return f"{said}, and {_token(step.fact)} {moved} from rank {step.fact_rank_full + 1} to {step.fact_rank_edited + 1}"


def _continuation(result: WhatIf) -> None:
    cont = result.continuation
    st.markdown(f"**Greedy continuations** ({cont.parting})")
    full, edited = st.columns(2)
    full.caption("full cache")
    full.code(cont.full, language=None, wrap_lines=True)
    edited.caption("edited cache")
    edited.code(cont.edited, language=None, wrap_lines=True)


def _standalone(result: WhatIf) -> None:
    """Keep this edit for the standalone page (a list saved with the session) and download the page."""
    session, kept = state.session(), state.prepared()
    left, right = st.columns([1, 2], vertical_alignment="center")
    if left.button("Keep this edit for the page", disabled=len(kept) >= MAX_PREPARED or result.edit.is_empty,
                   help="The standalone page shows the what-if of each kept edit; clicking a chip there switches "
                        "between them"):
        kept.append(Prepared(result.at, result.edit).to_dict())
        st.rerun()
    layer, head, detail = st.session_state.layer, state.head(), state.detail_head()
    views = [(layer, head)] if head is None else [(layer, None), (layer, head)]

    def page() -> str:  # built when the button is pressed
        prepared = [Prepared.from_dict(value) for value in kept]
        return standalone_html(page_data(session, prepared, views, (layer, detail)))

    right.download_button(f"Export as a standalone page ({len(kept)} kept edits; opens offline)", page,
                          file_name="kvviz-page.html", mime="text/html", on_click="ignore",
                          disabled=len(session) > MAX_SLOTS, help=f"Up to {MAX_SLOTS:,} slots")
    if kept and right.button("Forget the kept edits"):
        kept.clear()
        st.rerun()


def _buttons() -> None:
    session, draft = state.session(), state.draft()
    newest, at = len(session), state.step_slot()
    travelling = at < newest - 1
    if travelling:  # a commit edits what is still to come; looking back, the edit forks the conversation there
        st.info(f"You are looking back at step {at}. *Fork from step {at}* re-runs the conversation from this step "
                "on the edited cache — this reply and every later message answered afresh — as a new branch; this "
                "branch is kept, to compare with and come back to.", icon=":material/history:")
    cols = st.columns([2, 1, 1])  # the commit's label is the longest
    if travelling:
        if cols[0].button(f"Fork from step {at}", key="fork", type="primary",
                          help=f"Replays the conversation up to step {at}, commits the edit there and runs every "
                               "step after it again"):
            _fork(session, draft.edit(at), at)
    elif cols[0].button("Commit edit to the conversation", key="commit-edit",
                        help=f"Steps from slot {newest} on run on the edited cache"):
        try:
            session.commit(draft.edit(newest))
        except KvvizError as exc:
            warn(exc)
        else:
            draft.clear()
            st.rerun()
    if cols[1].button("Undo commit", disabled=not session.commits.stack, help="Takes the newest commit back"):
        session.undo()
        st.rerun()
    if cols[2].button("Reset edit"):
        draft.clear()
        st.rerun()


def _fork(session, edit, at: int) -> None:
    """Fork the conversation at the step of slot ``at`` (:func:`kvviz.fork.fork`) in the page's run, with progress;
    the branch left is kept."""
    try:
        state.make_room(len(session))
        fork_check(session, at, edit)
    except KvvizError as exc:
        warn(exc)
        return
    name = branches.fork_name(at)
    hand_over(Work(f"Forking at step {at}: the conversation replayed up to it, then run again on the edited cache",
                   lambda progress: fork(session, at, edit, int(st.session_state.max_new_tokens), progress),
                   lambda result: branches.forked(result, name)))
