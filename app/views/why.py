"""Why did this slot go? A policy's decision about one slot, per layer and KV head: its score, the threshold it fell
under (the lowest score kept there), its rank among the candidates and the budget (kvviz.policies.decision)."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from app.plain import code, plain
from kvviz.spelling import spell, spell_slot

COLUMNS = {"layer": "layer", "kv_head": "KV head", "step": "step", "outcome": "outcome", "score": "score",
           "threshold": "lowest kept score", "margin": "score − lowest kept", "rank": "rank", "candidates": "of",
           "budget": "budget", "reason": "why"}
NUMBERS = ("score", "threshold", "margin")


def pick(texts: list[str], slots: list[int], key: str, label: str = "Why did this slot go?") -> int | None:
    """A menu of ``slots`` (with their text), nothing chosen at first: the decision is computed once one is."""
    return st.selectbox(label, [None, *slots], key=key, help="Pick an evicted slot: its score under the policy, the "
                        "threshold it fell under and its rank, in every layer and KV head",
                        format_func=lambda s: "(choose an evicted slot)" if s is None else f"slot {spell_slot(s, texts[s])}")


def show(rows: list[dict], pairs: int, text: str, policy: str) -> None:
    """The rows of :meth:`kvviz.policies.decision.Decision.why` or :meth:`kvviz.runs.policy_run.PolicyRun.why` (as
    dicts) for a slot whose text is ``text``; ``pairs`` is the number of (layer, KV head) pairs."""
    evicted = sum(row["outcome"] == "evicted" for row in rows)
    st.markdown(f"{code(spell(text))}: {plain(policy)} evicts it in **{evicted} of {pairs}** (layer, KV head) "
                "pairs. In each, the policy ranks the candidates by score and keeps the budget's best; a slot goes "
                "when its score is under the lowest kept one, or ties it and comes later (ties keep the earlier "
                "slot; protected slots score ∞).")
    if not rows:
        return
    table = pd.DataFrame([{k: (_number(v) if k in NUMBERS else v) for k, v in row.items()}
                          for row in sorted(rows, key=lambda r: (r["outcome"] != "evicted", r["layer"], r["kv_head"]))])
    st.dataframe(table[[c for c in COLUMNS if c in table]].rename(columns=COLUMNS), hide_index=True)


def _number(value: float) -> str:
    """Four significant digits; a protected slot's score is ∞ (and a margin to it undefined)."""
    return f"{value:.4g}" if math.isfinite(value) else "∞" if value > 0 else "−∞" if value < 0 else "—"
