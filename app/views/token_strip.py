"""The cache strip: chips by segment and turn, shaded by attention; clicks evict, shift-clicks select, and the
bit-width picker quantizes the selection."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from app import state
from app.plain import plain, plural, warn
from app.components.strip import clicked, parse_click, token_strip
from app.views import branches, reshape, schemes
from kvviz import recurrent
from kvviz.attention_math import kv_head_of
from kvviz.schemes.calibration import calibrate
from kvviz.rope import pre_rope
from kvviz.errors import KvvizError
from kvviz.spelling import spell
from kvviz.quant.quantizer import Quantizer
from kvviz.view_data import (SHADINGS, commit_rows, find_slots, index_reasons, kept_per_head, read_count, sink_share,
                             strip_chips, strip_reasons, window_start)

BITS = [16, 8, 4, 3, 2]


def _on_click() -> None:
    click, at = clicked(), state.step_slot()
    if click is None:
        return
    try:
        slot, shift = parse_click(click, at + 1)
    except KvvizError as exc:
        state.notify(str(exc))
        return
    if slot == at:
        state.notify(f"slot {slot} is the token being processed at this step; it cannot be evicted")
    elif shift:
        state.draft().toggle_selected(slot)
    else:
        state.draft().toggle_evicted(slot)


def view_settings() -> None:
    """Layer, head and step: they change every view, so they live outside the editor fragment."""
    session = state.session()
    large = st.session_state.get("large", False)  # larger type: "Jump to" needs a wider column to stay one line
    view = st.columns([2, 2, 2, 3, 1.5 if large else 1], vertical_alignment="bottom")
    decoder = recurrent.kv_layers(session.lm.config)
    view[0].selectbox("Layer", range(session.lm.layers), key="layer",
                      format_func=lambda l: str(l) if len(decoder) == session.lm.config.num_hidden_layers else
                      f"{l} (decoder layer {decoder[l]})")
    view[1].selectbox("Head", [state.MEAN, *range(session.lm.heads)], key="head",
                      format_func=lambda h: "mean of heads" if h == state.MEAN else
                      f"head {h} (KV {kv_head_of(h, session.lm.heads, session.lm.kv_heads)})")
    view[2].selectbox("Chip shading", SHADINGS, key="shading",
                      help="How attention shades the chips: linear (relative to the strongest: a sink leaves the rest "
                           "white), log (six decades) or by rank")
    if len(session) > 1:  # both controls show the step in view (set through the state: no default to fight)
        state.show_step_in_pickers()
        view[3].slider("Step (time travel)", 0, len(session) - 1, key="at_slider", on_change=_travel)
        view[4].number_input("Jump to", 0, len(session) - 1, key="at_jump", on_change=_jump,
                             help="The step of this slot (the strip scrolls to it)")


def _jump() -> None:
    newest = len(state.session()) - 1
    chosen = st.session_state.at_jump
    state.travel(None if chosen == newest else chosen)


def render() -> None:
    session, draft = state.session(), state.draft()
    at = state.step_slot()
    shading = st.session_state.get("shading", "linear")
    reasons = strip_reasons(session, draft, st.session_state.layer, state.head())
    for slot, line in _index_reasons(session, at).items():  # sparse selection: the indexer's reason beside a policy's
        reasons[slot] = f"{reasons[slot]}\n{line}" if slot in reasons else line
    chips = strip_chips(session, draft, at, st.session_state.layer, state.head(), shading, reasons)
    scale = {"linear": "relative to the strongest slot", "log": "log scale over six decades",
             "rank": "by rank"}[shading]
    if not st.session_state.large:  # a projector shows the strip without its legend: the speaker tells it
        st.caption(f"Click a chip to evict it · shift-click to select · background = attention of the current step "
                   f"(dashed), {scale} · band: grey history, blue query, orange generated · struck through: the edit "
                   "you are trying (faded) or committed (grey, double line; purple filled badge: committed bits)")
    for note in (latent_note(session), sparse_note(session, at, st.session_state.layer), hybrid_note(session),
                 window_note(session, at, st.session_state.layer)):
        if note:
            st.caption(note)
    large = st.session_state.large
    if not large:
        _find(session, at)
    found = find_slots(session, at, st.session_state.get("find") or "")
    tour = state.kept("tour")
    token_strip(chips, at, _on_click, large=large, found=found, focus=tour and tour.get("focus"),
                sink=sink_share(session, at, st.session_state.layer, state.head()))
    if not large:  # presentation mode draws them below the top-k tables (see controls)
        controls()


def _index_reasons(session, at: int) -> dict[int, str]:
    """With sparse selection (DSA): each slot's indexer score and rank at this step in the chosen layer, from the
    what-if of this step (computed before the strip is drawn: ``whatif.compute`` keeps its detail); empty otherwise."""
    detail = state.whatif_detail()
    if not session.lm.attention.reads or detail is None or (detail.layer, len(detail.slots)) != (
            st.session_state.layer, at + 1):
        return {}
    return index_reasons(detail.index_scores, detail.unread)


def controls() -> None:
    """Below the strip: search (in presentation mode), the committed edits and the bit-width picker."""
    session, draft, at = state.session(), state.draft(), state.step_slot()
    if st.session_state.large:
        _find(session, at)
    _commits(session)
    branches.render()
    _picker(draft, session, at)


def _find(session, at: int) -> None:
    find, count = st.columns([2, 5], vertical_alignment="bottom")
    query = find.text_input("Find in the cache", key="find", placeholder="a word or phrase",
                            help="Highlights the chips of every match (yellow, also on the bar above the strip) and "
                                 "scrolls to the first")
    if query:
        found = find_slots(session, at, query)
        count.caption(f"{len(found)} slots match" if len(found) > 1 else "1 slot matches" if found else
                      "no slot matches")


def _commits(session) -> None:
    """The committed edits, newest first, each with its undo (which takes the later ones back too: they were made on
    top of it)."""
    rows = commit_rows(session)
    if not rows:
        return
    with st.container(border=True, key="commit-list"):
        st.markdown("**Committed edits** — part of the conversation: each is in force from its slot on")
        for row in reversed(rows):
            later = len(rows) - row["index"]
            parts = []
            if row["evicted"]:
                words = session.transcript.text_of(row["evicted"][:6]) + ("…" if len(row["evicted"]) > 6 else "")
                parts.append(f"evicted {plural(len(row['evicted']), 'slot')} ({spell(words)})")
            if row["quantized"]:
                parts.append(row["quantized"])
            text, button = st.columns([5, 1], vertical_alignment="center")
            ran = len(session) - row["at"]  # the steps that ran on it: one per slot cached since
            text.text(f"#{row['index'] + 1} · from slot {row['at']} (turn {row['turn']}) · "
                      + ("; ".join(parts) or "no change") + " · "
                      + (f"{plural(ran, 'step')} ran on it" if ran else "no step has run on it yet"))
            if button.button("Undo" if later == 1 else f"Undo with {later - 1} later", key=f"undo-{row['index']}"):
                try:
                    session.undo(later)
                except KvvizError as exc:
                    state.notify(str(exc))
                st.rerun()  # the whole page: every view shows the cache as it now is


def latent_note(session) -> str | None:
    """One line on a latent cache (MLA), or None for a model that caches keys and values per KV head."""
    lm = session.lm
    if lm.attention.latent is None:
        return None
    latent, rope = lm.geometry.cached_widths
    return (f"This model caches one latent per token (multi-head latent attention): {latent} latent and {rope} RoPE "
            f"channels per layer, from which all {lm.heads} heads derive their keys and values. A chip is a token's "
            "latent: evicting it removes the token for every head; bit-widths round the latent as keys and the RoPE "
            "key as values (fp8-ds-mla under Compare schemes stores it as vLLM does).")


def sparse_note(session, at: int, layer: int) -> str | None:
    """One line on the slots this step read (sparse selection, DSA), or None for a model that reads every slot."""
    counts = read_count(session, at, layer)
    if counts is None:
        return None
    read, seen = counts
    return (f"This model reads a subset of its cache at each step (DeepSeek sparse attention): a lightning indexer "
            f"scores every slot and each query reads the {session.lm.attention.reads} of highest score. At slot {at}, "
            f"layer {layer} read {read} of the {seen} slots it saw; the others are faded, with a dotted band. The "
            "cache keeps them all: evicting a slot that was read lets the indexer pick the next one of its ranking "
            "(the what-if lists the slots it admitted).")


def hybrid_note(session) -> str | None:
    """One line on a hybrid model's layers without KV, or None for a model whose every layer caches K/V."""
    config = session.lm.config
    linear = recurrent.linear_layers(config)
    if not linear:
        return None
    kv, state = recurrent.kv_layers(config), recurrent.nbytes(session.cache)
    return (f"This model is hybrid: of its {config.num_hidden_layers} decoder layers only {len(kv)} cache keys and "
            f"values (decoder layers {', '.join(map(str, kv))}: kvviz's layers 0–{len(kv) - 1}); the other "
            f"{len(linear)} ({', '.join(map(str, linear))}) are linear-attention layers that keep a recurrent state "
            f"of fixed size instead ({state / 1024:.1f} KiB, counted in the session's memory; the what-if's cache bytes "
            "are the K/V an edit changes). Evictions, bit-widths and policies touch the KV layers only; the recurrent "
            "layers see every token.")


def window_note(session, at: int, layer: int) -> str | None:
    """One line on the layer's sliding window at this step, or None for a layer that sees every slot."""
    window = session.lm.attention.window(layer)
    if window is None:
        return None
    start = window_start(session, at, layer)
    dropped = f"slots 0–{start - 1} (hatched) are outside it: this layer no longer holds them, and evicting or " \
              "quantizing them changes nothing here" if start else "no slot has left it yet"
    return f"Layer {layer} has a sliding window of {window} slots: at slot {at} it sees slots {start}–{at}; {dropped}."


def _travel() -> None:
    newest = len(state.session()) - 1
    chosen = st.session_state.at_slider
    state.travel(None if chosen == newest else chosen)


def apply_quantizers() -> str | None:
    """Set the draft's quantizers from the settings (widget state, so this can run before the widgets are drawn: the
    what-if is computed first); returns why they do not fit the model, or None."""
    ss, draft, lm = state.quantizer_settings(), state.draft(), state.session().lm
    try:
        if ss.number_format in ("e4m3", "e5m2") and ss.fp8_scales != "dynamic":  # static: vLLM's k_scale / v_scale
            calibration = calibrate(lm)
            unit = ss.fp8_scales == "1.0"
            draft.keys = calibration.quantizers(ss.number_format, "unit" if unit else ss.key_axis)[0]
            draft.values = calibration.quantizers(ss.number_format, "unit" if unit else ss.value_axis)[1]
        else:
            draft.keys = Quantizer(ss.key_axis, int(ss.group) or None, ss.symmetric, format=ss.number_format)
            draft.values = Quantizer(ss.value_axis, int(ss.group) or None, ss.symmetric, format=ss.number_format)
        if ss.pre_rope:  # KVQuant: keys rounded before RoPE, with the model's own frequencies
            draft.keys = replace(draft.keys, **pre_rope(lm))
        key_width, value_width = lm.geometry.cached_widths  # a latent and a RoPE key with latent attention
        draft.keys.check(key_width)
        draft.values.check(value_width)
    except KvvizError as exc:
        return str(exc)
    return None


def _quantizer_settings(head_dim: int) -> None:
    with st.expander("Quantizer settings (default KIVI: keys per channel, values per token)"):
        if st.session_state.get("large", False):  # large type in a projector's column: two rows of three, or the
            cols = [*st.columns([1, 1, 1.4]), *st.columns([1.3, 1, 1])]  # labels wrap letter by letter ("Forma t")
        else:
            cols = st.columns([1, 1, 1.2, 1.3, 1, 1])
        cols[0].selectbox("Keys", ["channel", "token", "head", "tensor"], key="key_axis",
                          help="one scale per channel, per slot, per KV head or per layer (an FP8 cache's per-head or per-layer scale)")
        cols[1].selectbox("Values", ["token", "channel", "head", "tensor"], key="value_axis")
        cols[2].number_input(f"Group size (channels; 0 = all {head_dim})", 0, head_dim, key="group")
        cols[3].toggle("Symmetric", key="symmetric")
        cols[3].toggle("Pre-RoPE keys", key="pre_rope",
                       help="KVQuant: each key is rotated back to before RoPE, rounded there and rotated forward "
                            "again; per-channel scales fit keys better before RoPE mixes their channel pairs")
        cols[4].selectbox("Format", ["int", "e4m3", "e5m2", "nvfp4", "mxfp4"], key="number_format",
                          on_change=state.fit_format,
                          help="int: uniform codes at the chosen bits · e4m3 / e5m2: FP8 as vLLM and SGLang cache it "
                               "(kv_cache_dtype fp8_e4m3 / fp8_e5m2), 8 bits, one float32 scale per group, scaled "
                               "to the group's largest value · nvfp4 / mxfp4: 4-bit E2M1 in blocks of 16 / 32 "
                               "channels of a slot (axis token), with E4M3 block scales and a tensor scale (NVFP4) or "
                               "power-of-two ones (MXFP4); Group size sets the block")
        cols[5].selectbox("FP8 scales", ["dynamic", "calibrated", "1.0"], key="fp8_scales",
                          disabled=st.session_state.number_format not in ("e4m3", "e5m2"),
                          help="dynamic: each group scaled to its largest value · calibrated: static scales per KV "
                               "head or per layer from a calibration text, as vLLM reads k_scale / v_scale from a "
                               "checkpoint (larger values saturate) · 1.0: vLLM's scale without calibration")
        problem = apply_quantizers()
        if problem:
            warn(problem)


def _set_bits(slots: list[int], selection: bool = False) -> None:
    """Button callback (runs before the rerun, so the strip and the what-if both show the change)."""
    draft = state.draft()
    draft.set_bits(slots, st.session_state.pick_k, st.session_state.pick_v)
    if selection:
        draft.selected = set()


def _picker(draft, session, at) -> None:
    if st.session_state.get("large", False):  # larger type: the buttons get a row of their own (labels cut otherwise)
        bits, buttons = st.columns([1, 1, 4]), st.columns(4)
        cols = [bits[0], bits[1], *buttons]
    else:
        cols = st.columns([1, 1, 2, 2, 2, 2])
    cols[0].selectbox("K bits", BITS, key="pick_k")
    cols[1].selectbox("V bits", BITS, key="pick_v")
    cols[2].button(f"Apply to {len(draft.selected)} selected", disabled=not draft.selected, on_click=_set_bits,
                   args=(sorted(draft.selected), True))
    history = session.transcript.history_slots(at)
    cols[3].button("History → these bits", disabled=not history, on_click=_set_bits, args=(history,))
    this_turn = session.transcript.turn_slots(at)
    cols[4].button("Evict this turn", disabled=not this_turn, on_click=lambda: state.draft().evict_many(this_turn))
    cols[5].button("Clear edit", on_click=lambda: state.draft().clear())
    _quantizer_settings(session.lm.geometry.cached_widths[0])
    reshape.render(session, draft, at)
    schemes.render(session, at)
    try:
        summary = draft.edit(at)
    except KvvizError as exc:
        warn(exc)
        return
    evicted = sorted(draft.evicted_somewhere())
    if draft.policy_name:  # a policy keeps slots per (layer, KV head): their union says little
        low, high = kept_per_head(session, summary, at)
        kept = f"{low}" if low == high else f"{low}–{high}"
        what = (f"Edit: {plain(draft.policy_name)} keeps {kept} of {at} slots per KV head ({len(evicted)} slots evicted "
                "in at least one layer or head)")
    else:
        what = f"Edit: {len(evicted)} slots evicted"
    reshaped = (f" · {sum(len(p.channels) for p in summary.prunings)} key channels pruned · {len(summary.merges)} "
                "merges" if summary.reshapes else "")
    st.caption(f"{what} · {len(summary.key_bits)} keys and {len(summary.value_bits)} values quantized{reshaped}")
