"""Edits beyond evicting and quantizing, on the draft: key channels pruned as ThinK prunes them, evicted values
merged into their most similar kept slot (D2O and kvpress' MergingPress average, CaM adds)."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from app import state
from kvviz.errors import KvvizError
from kvviz.policies.reshaping import merge_evicted, think


def render(session, draft, at: int) -> None:
    """The expander under the bit-width picker."""
    with st.expander("Prune key channels (ThinK) or merge evicted values (D2O, MergingPress, CaM)"):
        prune, merge = st.columns(2)
        ratio = prune.slider("Key channels pruned", 0.0, 0.9, 0.25, 0.05, key="think_ratio",
                             help="ThinK: per layer and KV head, the channels with the smallest mean(q²)·mean(k²) "
                                  "are zeroed in every slot before this step")
        window = prune.number_input("Queries that score them", 1, 1024, 32, key="think_window",
                                    help="ThinK's window: the last queries before this step")
        prune.button("Prune with ThinK", disabled=at < 1, on_click=_apply,
                     args=(lambda: draft.reshape(prunings=think(session, float(ratio), int(window), at)),))
        rule = merge.selectbox("Merge rule", ["average", "add"], key="merge_rule",
                               help="average (D2O, kvpress' MergingPress): the kept value becomes (v + Σ w·v_e)/(1 + Σ w)"
                                    " · add (CaM): v + Σ w·v_e")
        threshold = merge.slider("Least key similarity to merge", 0.0, 1.0, 0.0, 0.05, key="merge_threshold")
        evicted = bool(draft.evicted_somewhere())
        merge.button("Merge the evicted slots", disabled=not evicted, on_click=_apply,
                     args=(lambda: draft.reshape(merges=merge_evicted(session, replace(draft.edit(at), merges=()), at,
                                                                      float(threshold)).merges, rule=rule),),
                     help="Each slot evicted in a layer and KV head folds its value into the kept slot whose key is "
                          "most like its own there (its most similar kept slot), weighted by that similarity and the "
                          "two value norms")
        if draft.prunings or draft.merges:
            channels = sum(len(p.channels) for p in draft.prunings)
            st.caption(f"{channels} key channels pruned in {len(draft.prunings)} (layer, KV head) pairs · "
                       f"{len(draft.merges)} merges ({draft.merge_rule})")
            st.button("Clear prunings and merges", on_click=_apply, args=(lambda: draft.reshape((), ()),))


def _apply(change) -> None:
    """A button's callback: the change made before the run its click starts (the strip and the what-if of that run
    show it; a refusal is that run's warning)."""
    try:
        change()
    except KvvizError as exc:
        state.notify(str(exc))
