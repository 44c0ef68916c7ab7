"""Policy run: a policy compresses the cache as it runs; the replies side by side, per-step KL, the cache size, the
eviction timeline, and a step's blame (which evicted slots mattered)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import state
from app.components.scroll import look_at, mark
from app.plain import code, plain, spans, warn
from app.long_work import Work, hand_over
from app.views import why
from app.views.policy_choice import parameters, policy_classes
from app.views.slide_download import slide_popover
from kvviz import figures
from kvviz.figures import plot_slides
from kvviz.figures.slides import PLOTLY_CONFIG
from kvviz.errors import KvvizError
from kvviz.runs.blame import blame, restorable, restore, variants
from kvviz.runs.forecast import first_compression
from kvviz.runs.from_names import from_names
from kvviz.policies.base import Ratio
from kvviz.policies.registry import is_press, names
from kvviz.schemes.kivi import Kivi
from kvviz.runs.policy_run import held_slots, run_policy
from kvviz.spelling import spell
from kvviz.edit.reshape import Reshape
from kvviz.whatif.metrics import compare


QUANTIZED = {"quanto 4 bits": "quanto-4", "quanto 2 bits": "quanto-2", "hqq 8 bits": "hqq-8", "hqq 4 bits": "hqq-4",
             "hqq 2 bits": "hqq-2", "fp8": "quantized-fp8"}  # the QuantizedCache menu → its scheme names
WRITTEN = ["16 bits (as computed)", "nvfp4", "nvfp4-4over6", "mxfp4", "mxfp4-b16", "fp8-e4m3-head", "fp8-e4m3-unit",
           "int8-token-head", "int4-token-head", "fp8-token-head", "k8v4-token-head", "k4v2-token-head", "int4-token"]


def render() -> None:
    session = state.session()
    classes = policy_classes()
    turns = [turn["user"] for turn in session.turns]
    kivi_on = st.checkbox("KIVI quantization", key="run-kivi", help="KIVI keeps the newest R slots at 16 bits and "
                          "quantizes older ones in groups of G as they leave that window: keys per channel, values per "
                          "token, at the chosen bits (its settings below are used only when this is on)")
    offered = ["(none: a quantized cache only)", *names(classes)]
    # outside the form: choosing a policy shows its own parameters at once, and a press sets what kvpress does
    name = st.selectbox("Policy", offered, index=offered.index("h2o"), key="run-policy",
                        on_change=_chosen, args=(classes,),
                        help="kvviz's policies, then kvpress' presses by their own names (kvpress:…), with the "
                             "settings that reproduce them; a press compresses once after the prompt at kvpress' "
                             "ratio (choosing one sets Compress: prefill and a ratio of 0.5)")
    press = is_press(name, classes)
    with st.form("policy-run"):
        cols = st.columns([3, 2, 2, 2, 2])
        budget = cols[1].number_input("Budget (slots)", min_value=1, value=32, step=8, disabled=press,
                                      help="slots each step sees besides its own, in every layer and KV head (the "
                                           "Policies tab's budget is a fraction of the slots; here 32 of a 64-slot "
                                           "prompt is 0.5); or give kvpress' ratio (a press takes only the ratio)")
        state.run_press_defaults()
        ratio = cols[4].number_input("or kvpress ratio", min_value=0.0, max_value=0.95, step=0.05, key="run-ratio",
                                     help="kvpress' compression_ratio, the fraction removed (int(n·(1 − ratio)) of the "
                                          "prompt's n slots kept) instead of the budget; 0: the budget (a press: "
                                          "nothing removed)")
        mode = cols[2].selectbox("Compress", MODES, key="run-mode",
                                 help="prefill: once after the prompt; decode: before every step over the budget; "
                                      "after_steps: after every N-th step, as kvpress' DecodingPress")
        every = cols[3].number_input("Every N steps", min_value=1, value=1)
        quant = st.columns(4)
        bits = quant[1].selectbox("KIVI bits", [2, 4], index=0, disabled=not kivi_on)
        group = quant[2].number_input("KIVI group G", min_value=1, value=32, disabled=not kivi_on)
        residual = quant[3].number_input("Full-precision R", min_value=0, value=128)
        quanto_bits = quant[0].selectbox("QuantizedCache", ["off", *QUANTIZED],
                                         help="The run's cache as transformers' QuantizedCache. quanto, HQQ: the "
                                              "prompt quantized at once, then every R new slots all quantized again "
                                              "together (R: Full-precision R; groups of 64, axis 0). fp8: one E4M3 "
                                              "scale per layer frozen at the first pass; every later slot rounded "
                                              "when written, and the step attends to its own K/V rounded")
        written = st.selectbox("Cache format", WRITTEN, key="run-written",
                               help="The run's cache in an engine's format, each slot rounded once when it is written "
                                    "(vLLM's kv_cache_dtype); FP8's dynamic and NVFP4's tensor scales are fixed by the "
                                    "first pass, as vLLM's --calculate-kv-scales. Not with KIVI or QuantizedCache")
        grouping = st.radio("KIVI key scales", ["blocks", "shared"], horizontal=True, disabled=not kivi_on,
                            help="blocks: one scale per channel and group of G slots (KIVI); shared: one for all")
        positions = st.radio("Positions", ["original", "rerotated"], horizontal=True,
                             help="original: every key keeps the position it was computed at; rerotated "
                                  "(StreamingLLM's paper): kept keys move to the positions of their order in the "
                                  "cache and the next token follows them (policies that keep the same slots "
                                  "everywhere: streaming_llm, random)")
        reading = st.columns([3, 2])
        readers = ["(none: each step reads every slot kept)", *(n for n in names(classes) if ":" not in n)]
        reader = reading[0].selectbox("Read per step with", readers, key="run-reader",
                                      help="Keep the whole cache and let this policy's scores choose, before each "
                                           "decode step, the slots that step reads (sparse attention, as Quest or "
                                           "RocketKV's second stage); with a policy above, among the slots it kept")
        reads = reading[1].number_input("Slots read per step", min_value=1, value=16, key="run-reads",
                                        help="per layer and KV head, besides the step's own")
        shape = st.columns([2, 2, 3])
        think_share = shape[0].number_input("ThinK: key channels pruned", min_value=0.0, max_value=0.9, value=0.0,
                                            step=0.05, help="At each prompt, the share of key channels ThinK prunes "
                                                            "per layer and KV head (kvpress' ThinKPress); 0: none")
        merge_on = shape[1].checkbox("Merge the evicted", help="What each prompt's compression evicts folds into the "
                                     "most similar kept slot (kvpress' MergingPress, D2O); Compress: prefill or both")
        rule = shape[2].radio("Merge rule", ["average", "add"], horizontal=True,
                              help="average: (v + Σ w·v_e)/(1 + Σ w), as D2O and MergingPress · add: as CaM")
        policy = None
        if name != offered[0]:
            params = parameters(st, classes, name, "run")
        prompt = st.text_area("Turns (one per line; default: this conversation's messages)", "\n".join(turns))
        max_new = st.number_input("New tokens per turn", min_value=2, max_value=512, value=32)
        submitted = st.form_submit_button("Run the policy")
    if submitted:
        try:
            policy = None if name == offered[0] else name
            reader = None if reader == readers[0] else reader
            kivi = Kivi(bits, bits, int(group), int(residual), grouping) if kivi_on else None
            reshape = Reshape(float(think_share), merge=merge_on, merge_rule=rule) if think_share or merge_on else None
            schemes = ([] if quanto_bits == "off" else [QUANTIZED[quanto_bits]]) + (
                [] if written == WRITTEN[0] else [written])
            by_ratio = policy is not None and (ratio > 0 or press)
            settings = from_names(policy, params if policy else None, budget=None if by_ratio or policy is None
                                  else int(budget), ratio=float(ratio) if by_ratio else None, mode=mode,
                                  every=int(every), positions=positions, schemes=schemes, kivi=kivi, reshape=reshape,
                                  classes=classes, residual=max(int(residual), 1), reader=reader,
                                  reads=None if reader is None else int(reads))
            lines = [line for line in prompt.splitlines() if line.strip()]
            state.make_room(held_slots(session.lm, lines, int(max_new)))
            lm, count = session.lm, int(max_new)
            work = Work("Running the full cache and the policy side by side",
                        lambda progress: run_policy(lm, lines, settings, count, progress),
                        lambda result: _kept(result, name))
            forecast = first_compression(lm, lines, settings)
            window = next(((key, value) for key, value in (params or {}).items() if "window" in key), None) \
                if policy is not None else None
            state.ask_before(work, f"{forecast} {forecast.advice(by_ratio, 'Budget (slots)', 'kvpress ratio', window)}"
                             if forecast is not None and forecast.recency_only else None)
            if not state.asked():
                hand_over(work)
        except KvvizError as exc:
            warn(exc)
    _ask()
    result = state.kept("policy_run")
    if result is not None and state.asked() is not None:  # the result below would read as these settings'
        st.caption("The previous run's result is hidden while these settings wait: run them, or change them to see "
                   "it again.")
    elif result is not None:
        _show(result)


MODES = ["decode", "prefill", "both", "after_steps"]


def _kept(result, name: str) -> None:
    """A run the form started, finished: kept, and its replies brought into view (they are drawn below the form,
    under the fold of a projector's screen)."""
    state.keep_policy_run(result, named=name)
    look_at("run")


def _ask() -> None:
    """A run held back before it runs (its budget holds only what the policy always keeps): why, and the way on."""
    asked = state.asked()
    if asked is None:
        return
    work, why = asked
    warn(f"Not run yet: {why}")
    go, back = st.columns([1, 3])
    if go.button("Run it anyway", key="run-anyway"):
        state.ask_before(None, None)
        hand_over(work)
    back.button("Change the settings", key="run-change", on_click=state.ask_before, args=(None, None))


def _chosen(classes: dict) -> None:
    """A press chosen: kvpress compresses once after the prompt, at its ratio (0.5 unless one is given)."""
    state.run_press_defaults(is_press(st.session_state["run-policy"], classes))


def _show(result) -> None:
    mark("run")  # a tour step about the run brings its replies into view
    policy, named = result.settings.policy, state.policy_run_named()
    shown = f"{named} (run as kvviz's {policy.name}) · " if policy and named and named != policy.name else ""
    st.caption(plain(shown + result.settings.label))
    for index in range(len(result.turns)):
        only, decisions = result.recency_only(index)
        if only:
            pressed = isinstance(result.settings.budget, Ratio)
            warn(f"Turn {index + 1}: at {only} of its {decisions} compressions the budget held only the slots "
                 f"{policy.name} always keeps (its recent window or sinks) — its scores chose nothing, the most "
                 "recent slots were kept. " + ("A lower kvpress ratio" if pressed else "A larger Budget (slots)")
                 + " (or a smaller window, where the policy has a window parameter) lets it choose.")
    for index, turn in enumerate(result.turns):
        left, right = st.columns(2)
        parted = "same answer" if not turn.changed else (
            "differs from its first token on (step −1)" if turn.divergence == -1 else
            f"diverges at step {turn.divergence}")
        left.markdown(f"**Turn {index + 1} · full cache**  \n{plain(turn.full_text)}")
        right.markdown(f"**Policy · {parted}**  \n{plain(turn.policy_text)}")
    ranked = state.kept("policy_blame")
    index = len(result.turns) - 1
    if len(result.turns) > 1:
        index = st.selectbox("Turn to look into", range(len(result.turns)), format_func=lambda i: f"turn {i + 1}",
                             index=ranked.turn if ranked is not None else index, key=f"run-turn-{id(result)}")
    run = result.turns[index]
    lm = run.forced.session.lm
    caption, stem = plot_slides.run_caption(lm.name, result, index), f"kvviz-run-turn{index + 1}"
    st.plotly_chart(figures.kl_steps(result, index), key="run-kl", config=PLOTLY_CONFIG)
    slide_popover("run-kl", lambda: plot_slides.kl_slide(result, index, caption), f"{stem}-kl")
    st.plotly_chart(figures.cache_size(result, index), key="run-size", config=PLOTLY_CONFIG)
    slide_popover("run-size", lambda: plot_slides.cache_size_slide(result, index, caption), f"{stem}-size")
    pieces = [slot.text for slot in run.forced.session.transcript.slots]
    cols = st.columns(2)
    layer = cols[0].selectbox("Timeline of layer", ["all", *range(lm.layers)], key="run-layer")
    head = cols[1].selectbox("KV head", ["all", *range(lm.kv_heads)], key="run-head")
    layer, head = None if layer == "all" else layer, None if head == "all" else head
    if result.settings.policy is not None and run.steps:
        st.plotly_chart(figures.timeline(result, pieces, index, layer, head), key="run-timeline", config=PLOTLY_CONFIG)
        slide_popover("run-timeline", lambda: plot_slides.timeline_slide(result, pieces, index, caption, layer, head),
                      f"{stem}-timeline")
        gone = sorted({row["slot"] for row in result.evictions(index)})
        slot = why.pick(pieces, gone, key=f"run-why-{id(result)}-{index}")
        if slot is not None:
            why.show(result.why(slot, index), lm.layers * lm.kv_heads, pieces[slot], result.settings.policy.name)
    if result.windowed and run.steps:
        st.plotly_chart(figures.bit_widths(result, pieces, index), key="run-bits", config=PLOTLY_CONFIG)
        slide_popover("run-bits", lambda: plot_slides.bit_widths_slide(result, pieces, index, caption), f"{stem}-bits")
    default = run.divergence if run.divergence is not None else 0 if run.steps else -1
    if ranked is not None and ranked.turn == index:
        default = ranked.step
    step = st.number_input("Open step", min_value=-1, max_value=len(run.steps) - 1, value=default,
                           key=f"run-step-{id(result)}-{index}",
                           help="−1: the prompt's last token, whose prefill row chose the first reply token; "
                                "0, 1, …: the decode steps")
    _step(result, index, int(step))


def _step(result, turn: int, step: int) -> None:
    run = result.turns[turn]
    record = run.record(step)
    session = run.forced.session
    token = session.transcript.slots[record.slot]
    what = " (the prompt's last token: its prefill row chose the first reply token)" if step == -1 else ""
    st.markdown(f"**Step {step}**{what} processes slot {record.slot} {code(spell(token.text))} and sees "
                f"{record.visible:.0f} of {record.slot} cached slots · KL {record.kl:.4f} · "
                f"top-1 {'agrees' if record.top1_agree else 'differs'}")
    # a forward pass: kept in the run's session memo (its cache never changes) rather than redone on every rerun
    table = session.memoized("run_step_table", step, lambda: compare(
        run.full_logits[step + 1], variants(run, step, [set()])[0][1], 8, session.piece), keep=4)
    st.dataframe(pd.DataFrame({"full run": [spell(c.text) for c in table.full], "p full": [c.prob for c in table.full],
                               "policy cache": [spell(c.text) for c in table.edited],
                               "p policy": [c.prob for c in table.edited]}), hide_index=True)
    kinds = restorable(result)
    if not kinds:
        return
    cols = st.columns(4)
    unit = cols[0].radio("Blame unit", ["slot", "word"], horizontal=True, key="run-unit")
    of = cols[3].radio("Put back", kinds, horizontal=True, key="run-blame-of",
                       help="evicted: each evicted slot back alone; rounded: each rounded slot back at full "
                            "precision alone; unread: each slot the step saw but its indexer did not pick, read "
                            "beside the ones it picked") if len(kinds) > 1 else kinds[0]
    if cols[1].button("Blame this step", key="run-blame"):
        try:
            state.keep("policy_blame", blame(result, turn=turn, step=step, unit=unit, of=of))
            look_at("blame")  # its table comes into view (drawn below the step's)
        except KvvizError as exc:
            warn(exc)
    ranked = state.kept("policy_blame")
    if ranked is None or (ranked.turn, ranked.step) != (turn, step):
        return
    mark("blame")
    what, back = {"evicted": ("evicted", "back"), "rounded": ("rounded", "at full precision"),
                  "unread": ("unread", "read")}[ranked.of]
    st.markdown(f"Restoring one {what} {ranked.unit} at a time {back} into the run's cache of this step, "
                f"KL(full ‖ policy) in nats: **{ranked.kl:.4f}** with nothing restored, "
                f"**{ranked.kl_all_restored:.4f}** with every {what} slot {back}.")
    if ranked.of == "evicted" and ranked.kl_all_restored > 0.5 * ranked.kl:
        st.caption("Putting everything back leaves much of the gap: the slots this run wrote itself (its reply so far, "
                   "a later turn's prompt) hold keys and values computed on its compressed cache, which eviction at "
                   "this step cannot explain.")
    rows = sorted(ranked.rows, key=lambda r: not r.top1_restored)  # those that bring the full run's token back first
    heads = session.lm.layers * session.lm.heads  # the mass is summed over layers and query heads: as a share, their mean
    st.dataframe(pd.DataFrame([{"top-1 back": r.top1_restored, "text": spell(session.transcript.text_of(r.slots)),
                                "KL after restore": r.kl_after_restore, "ΔKL": r.kl_after_restore - ranked.kl,
                                "attention share": r.mass / heads, "slots": spans(r.slots)} for r in rows]),
                 hide_index=True, column_config={
                     "KL after restore": st.column_config.NumberColumn(
                         format="%.4f", help="KL(full ‖ policy) in nats at this step with these slots back"),
                     "ΔKL": st.column_config.NumberColumn(
                         format="%+.4f", help="KL after restore minus KL with nothing restored (nats): negative helps"),
                     "attention share": st.column_config.NumberColumn(
                         format="percent", help="The share of this step's attention that goes to these slots with "
                                                "nothing hidden, averaged over layers and query heads (the ranking "
                                                "of the candidates)"),
                     "slots": st.column_config.TextColumn(width="medium")})
    if any(r.top1_restored and r.kl_after_restore > ranked.kl for r in rows):
        st.caption("A row can bring the full run's top-1 back and still raise KL: restoring moves the whole "
                   "distribution, its most likely token can come back while the rest moves further away.")
    if cols[2].button("Restore the top 3", key="run-top3") and ranked.rows:
        slots = sorted({s for r in ranked.rows[:3] for s in r.slots})
        row = restore(result, slots, turn=turn, step=step, of=ranked.of)
        words = " · ".join(spell(session.transcript.text_of(r.slots)) for r in ranked.rows[:3])
        st.success(f"{plain(words)} (slots {slots}) restored together: KL {row.kl_after_restore:.4f}, "
                   f"top-1 {'back' if row.top1_restored else 'still different'}")

