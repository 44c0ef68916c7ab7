"""Sweeps: a sweep run here (:mod:`app.views.sweep_form`) or a sweep's table (uploaded, or one of the server's
``KVVIZ_SWEEPS`` folders), damage against budget per policy, the worst cases first, and any case opened as a live
policy run with one click. A line or row that cannot be shown (:mod:`kvviz.sweeps.table` says which and why) is
named above the table; the other rows are shown."""

from __future__ import annotations

import io

import pandas as pd
import streamlit as st

from app import state
from app.components.scroll import look_at
from app.plain import plural, warn
from app.long_work import Work, hand_over
from app.views import sweep_form
from app.views.policy_choice import policy_classes
from kvviz import figures, settings
from kvviz.errors import KvvizError
from kvviz.runs.policy_run import held_slots, run_policy
from kvviz.sweeps.cases import case_of, run_settings
from kvviz.sweeps.table import Sweep, load_sweep, records, usable

COLUMNS = ["prompt_id", "policy", "budget", "kl_mean", "kl_max", "top1_agreement", "divergence", "answer_changed",
           "full_match", "policy_match", "policy_text"]
SHOWN_PROBLEMS = 10  # lines or rows left out named one by one; the rest counted


SOURCES = ["Run a sweep here", "Open a sweep's table"]


def render() -> None:
    served = bool(settings.listed("KVVIZ_SWEEPS"))  # a server that lists sweeps opens on them
    here = st.segmented_control("Sweep", SOURCES, default=SOURCES[served], key="sweep-source",
                                label_visibility="collapsed") != SOURCES[1]
    if here:
        sweep_form.render()
        sweep = state.page_sweep()
    else:
        sweep = _sweep()
    if sweep is None:
        if not here:
            st.info("Upload the table.parquet (or .csv) of a `python -m kvviz sweep … --out DIR` run, or choose "
                    "one of this server's sweeps.")
        return
    for problem in sweep.problems[:SHOWN_PROBLEMS]:
        warn(f"Left out: {problem}")
    if len(sweep.problems) > SHOWN_PROBLEMS:
        warn(f"… and {plural(len(sweep.problems) - SHOWN_PROBLEMS, 'more line or row')} left out")
    table = sweep.table
    if table.empty:
        warn("this sweep table holds no row that can be shown" + (" (each is named above)" if sweep.problems else ""))
        return
    chart = figures.damage_chart(table)
    st.vega_lite_chart(chart.data, chart.spec, key="sweep-damage")
    worst = table.sort_values("kl_mean", ascending=False).reset_index(drop=True)
    st.caption(f"{plural(len(table), 'case')}, the worst first (mean KL of the policy against the full cache, teacher-forced on "
               "the full reply).")
    number = st.column_config.NumberColumn
    st.dataframe(worst[[c for c in COLUMNS if c in worst]], hide_index=True, key="sweep-rows", column_config={
        "prompt_id": "prompt", "policy_text": "policy's reply",
        "kl_mean": number("mean KL", format="%.4f", help="mean KL(full ‖ policy) over the reply's steps, nats"),
        "kl_max": number("max KL", format="%.4f", help="largest KL(full ‖ policy) of a step, nats"),
        "top1_agreement": number("top-1 agrees", format="percent", help="share of the reply's tokens the policy's "
                                 "cache would choose too (teacher-forced)"),
        "divergence": number("diverges at step", help="the first step whose choice differs; −1: the first reply "
                             "token already (the prompt's last row chose it); empty: never"),
        "answer_changed": "answer changed", "full_match": "full finds the answer",
        "policy_match": "policy finds the answer"})
    if here:
        st.download_button("Download the table (CSV)", worst.to_csv(index=False), "sweep.csv", "text/csv",
                           key="sweep-download", help="the rows as `python -m kvviz sweep` writes them; the Open "
                                                      "tab reads them back")
    rows = records(worst)
    pick, go = st.columns([4, 1], vertical_alignment="bottom")
    index = pick.selectbox("Case", range(len(rows)), key="sweep-case", format_func=lambda i: (
        f"{rows[i]['prompt_id']} · {rows[i]['policy']} · budget {case_of(rows[i]).budget} · KL {rows[i]['kl_mean']:.4f}"))
    if go.button("Open as a policy run", key="sweep-open"):
        _open(rows[index])


def _sweep() -> Sweep | None:
    """The chosen table, checked to be a sweep's and row by row; None when there is none yet."""
    folders = settings.listed("KVVIZ_SWEEPS")
    source = st.selectbox("Sweep on this server (KVVIZ_SWEEPS)", ["(upload one)", *folders]) if folders else None
    try:
        if source and source != "(upload one)":
            return load_sweep(source)
        upload = st.file_uploader("Sweep table (table.parquet or table.csv)", type=["parquet", "csv"],
                                  key="sweep-upload")
        if upload is None:
            return None
        data = io.BytesIO(upload.getvalue())
        table = pd.read_parquet(data) if upload.name.endswith(".parquet") else pd.read_csv(data)
        return usable(table, name=upload.name)
    except KvvizError as exc:
        warn(exc)
        return None
    except Exception as exc:  # a file that is not a table at all
        warn(f"cannot read this table ({type(exc).__name__}); upload the table.parquet or table.csv of a sweep")
        return None


def _open(row: dict) -> None:
    """Run the row's case again, on this page's model, and show it in the Policy run tab."""
    session = state.session()
    try:
        case = case_of(row)
        settings = run_settings(case, policy_classes())
        state.make_room(held_slots(session.lm, list(case.prompt.turns), case.max_new_tokens))
    except (KvvizError, ValueError, TypeError) as exc:
        warn(exc if isinstance(exc, KvvizError) else f"this row cannot be opened ({exc})")
        return
    lm, turns = session.lm, list(case.prompt.turns)

    def opened(result) -> None:
        state.keep_policy_run(result)
        look_at("run")  # the run's replies, at the top of the Policy run tab's results
        state.notify(f"Opened {case.prompt.id} · {case.policy} · budget {case.budget} as a policy run on {lm.name}: "
                     "it is in the Policy run tab.", note=True)
        state.open_view("Policy run")

    hand_over(Work("Running the case again: the full cache and the policy side by side",
                   lambda progress: run_policy(lm, turns, settings, case.max_new_tokens, progress), opened))
