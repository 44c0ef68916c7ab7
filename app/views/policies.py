"""Policies: seed the strip with a policy's eviction mask, or compare two policies at the same budget."""

from __future__ import annotations

from dataclasses import asdict

import streamlit as st

from app import state
from app.plain import warn
from app.views import why
from app.views.policy_choice import build, kept_fraction, parameters, policy_classes
from kvviz.policies.registry import is_press, names
from kvviz.errors import KvvizError
from kvviz.policies import Policy
from kvviz.policies.base import slots_kept
from kvviz.whatif.compare_policies import compare_policies


def render() -> None:
    session, at = state.session(), state.step_slot()
    if at < 2:
        st.info("Policies need a few cached slots before the current step.")
        return
    classes = policy_classes()
    offered = names(classes)
    cols = st.columns([2, 2, 2])
    first = cols[0].selectbox("Policy", offered, index=offered.index("h2o"))
    second = cols[1].selectbox("Compare with", offered, index=offered.index("streaming_llm"))
    fraction = cols[2].slider("Budget (fraction of slots kept)", 0.05, 1.0, 0.5, 0.05,
                              help="With a kvpress press on either side, kvpress' compression ratio 1 − this, "
                                   "rounded as kvpress rounds: int(n·(1 − ratio)) slots kept")
    budget = kept_fraction(fraction, is_press(first) or is_press(second))
    cols[2].caption(f"{slots_kept(budget, at)} of the {at} slots before this step kept, in every layer and KV head")
    try:
        policies = [build(classes, name, parameters(cols[side], classes, name, f"policy-{side}"))
                    for side, name in enumerate((first, second))]
    except KvvizError as exc:
        warn(exc)
        return
    for name, policy in zip((first, second), policies):
        extra = policy.extra_tokens(session, at)
        if extra:
            st.caption(f"{name} runs {extra} more tokens through the model to decide ({extra / at:.1f}× the "
                       f"{at} cached slots): its own passes, on top of the conversation's")
    left, right = st.columns(2)
    if left.button(f"Put {first}'s mask on the strip"):
        try:
            state.draft().seed(policies[0].edit(session, budget, at), first, policies[0].settings(),
                               (policies[0], budget, at))
        except KvvizError as exc:
            warn(exc)
        else:
            st.rerun()
    if right.button("Compare the two"):
        try:
            state.keep("comparison", compare_policies(session, policies, budget, at))
        except KvvizError as exc:
            warn(exc)
    _why(session, policies[0], first, budget, at)
    report = state.kept("comparison")
    if report:
        number = st.column_config.NumberColumn
        st.dataframe([asdict(row) for row in report.rows], hide_index=True, column_config={
            "kept": number("slots kept", help="per layer and KV head, on average"),
            "kl": number("KL", format="%.4g", help="KL(full ‖ policy) of the next token, nats"),
            "tv": number("TV", format="%.4g", help="total variation distance of the next token's distributions"),
            "top1_changed": st.column_config.CheckboxColumn("top-1 changes"),
            "mean_rho": number("mean ρ", format="%.3f", help="evicted attention mass, mean over layers and heads"),
            "edited_bytes": number("cache bytes after", format="%d", help="packed K/V bytes of the kept slots")})
        if report.overlap is not None:
            st.caption(f"Overlap of the evicted (layer, KV head, slot) entries: {report.overlap:.1%} (Jaccard)")


def _why(session, policy: Policy, name: str, budget: float, at: int) -> None:
    """Why the first policy evicts a slot at this budget and step (the mask its button puts on the strip)."""
    texts = [slot.text for slot in session.transcript.slots[:at]]
    chosen = next(iter(sorted(state.draft().selected)), None)  # a slot selected on the strip comes first
    slots = ([chosen] if chosen is not None and chosen < at else []) + [s for s in range(at) if s != chosen]
    slot = why.pick(texts, slots, key="policy-why", label=f"Why does {name} evict a slot here?")
    if slot is None:
        return
    try:
        decision = session.memoized("why", (repr(policy), repr(budget), at), lambda: policy.decision(session, budget, at),
                                    keep=1)
    except KvvizError as exc:
        warn(exc)
        return
    lm = session.lm
    why.show([asdict(row) | {"margin": row.margin} for row in decision.why(slot)], lm.layers * lm.kv_heads,
             texts[slot], name)
