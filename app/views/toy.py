"""The toy numbers of docs/math.md §3, when that demo is chosen: α, the evicted mass ρ and α′ = α/(1−ρ) for two evictions."""

from __future__ import annotations

import streamlit as st

from app import state


def render() -> None:
    if state.kept("toy") is None:
        return
    scenario, cases = state.kept("toy")
    with st.expander(f"{scenario.name} — {scenario.description}", expanded=True):
        alpha = scenario.toy["alpha"]
        rows = [{"": "α", **{f"#{i + 1}": f"{a:.3f}" for i, a in enumerate(alpha)}, "ρ": ""}]
        for evict, case in zip(scenario.toy["evict"], cases):
            label = "α′ (evict " + ", ".join(f"#{e + 1}" for e in evict) + ")"
            rows.append({"": label, **{f"#{i + 1}": "evicted" if v is None else f"{v:.3f}"
                                       for i, v in enumerate(case["alpha_renorm"])}, "ρ": f"{case['rho']:.2f}"})
        st.dataframe(rows, hide_index=True)
        if st.button("Close the toy example"):
            state.keep("toy", None)
            st.rerun()
