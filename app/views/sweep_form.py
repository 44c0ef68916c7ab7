"""Running a sweep from the Sweeps tab: prompts (a built-in set or an uploaded JSONL file), policies, budgets, cache
formats and a reply length, run on this page's model in the page's run (progress, Stop); the rows are the ones
``python -m kvviz sweep`` writes (:func:`kvviz.sweeps.cases.run_cases`), shown below and offered as a CSV download."""

from __future__ import annotations

import streamlit as st

from app import state
from app.long_work import Work, hand_over
from app.plain import plural, warn
from app.views.policy_choice import kept_fraction, policy_classes
from kvviz.policies.registry import is_press, names
from kvviz.errors import KvvizError
from kvviz.schemes.written import run_cache
from kvviz.runs.policy_run import held_slots
from kvviz.sweeps.cases import cases_for, refuse_too_long, run_cases
from kvviz.sweeps.sources import BUILTIN, load_prompts, uploaded_prompts
from kvviz.sweeps.table import frame, usable

UPLOAD = "(upload a JSONL file)"
FRACTIONS = [0.1, 0.25, 0.5, 0.75]  # of the slots kept
MODES = ["decode", "prefill"]
BATCH = 4  # cases of a prompt decoded together, as the CLI does
CACHES = ["16 bits (as computed)", "nvfp4", "nvfp4-4over6", "mxfp4", "fp8-e4m3-head", "fp8-e4m3-unit",
          "int8-token-head", "int4-token-head", "k8v4-token-head", "kivi-2", "quanto-4",
          "quantized-fp8"]  # the cases' caches


def render() -> None:
    """The form; a submitted sweep is handed to the page's run and its table kept for the Sweeps tab."""
    classes = policy_classes()
    offered = names(classes)
    with st.form("sweep-run"):
        source, limit = st.columns([3, 1])
        chosen = source.selectbox("Prompts", [f"builtin:{name}" for name in BUILTIN] + [UPLOAD], key="sweep-prompts",
                                  help="built-in sets are generated here (needle in a haystack, key-value, variable "
                                       "tracking, RULER-style tasks); a JSONL file holds one prompt a line: "
                                       '{"prompt": "…", "expected": "…"} or {"turns": ["…", "…"]}')
        count = limit.number_input("First N prompts", min_value=1, max_value=500, value=2, key="sweep-limit")
        upload = st.file_uploader("Prompt file (JSONL; read when Prompts is \"upload\")", type=["jsonl", "json", "txt"],
                                  key="sweep-prompt-file")
        policies = st.multiselect("Policies", offered, default=[n for n in ("h2o", "snapkv") if n in offered],
                                  key="sweep-policies",
                                  help="each with its default settings (kvpress' presses by their own names)")
        left, middle, right = st.columns(3)
        fractions = left.multiselect("Budgets (share of the prompt's slots kept)", FRACTIONS, default=[0.25, 0.5],
                                     key="sweep-budgets", help="with a kvpress press among the policies: kvpress' "
                                     "compression ratio 1 − share")
        mode = middle.selectbox("Compress", MODES, key="sweep-mode",
                                help="decode: before every step over the budget; prefill: once after the prompt "
                                     "(as kvpress' presses do)")
        new_tokens = right.number_input("New tokens per reply", min_value=2, max_value=256, value=16,
                                        key="sweep-new-tokens")
        formats = st.multiselect("Cache formats", CACHES, default=CACHES[:1], key="sweep-caches",
                                 help="each case's cache besides its policy: as computed, or in an engine's format "
                                      "with each slot rounded when written (NVFP4, MXFP4, FP8, per-token-head int), "
                                      "KIVI or transformers' QuantizedCache: which prompts a format breaks")
        submitted = st.form_submit_button("Run the sweep", type="primary")
    if submitted:
        _start(chosen, upload, int(count), policies, fractions, mode, int(new_tokens), classes, formats)


def _start(chosen: str, upload, limit: int, policies: list[str], fractions: list[float], mode: str,
           new_tokens: int, classes: dict, formats: list[str]) -> None:
    """Check the form and hand the sweep to the page's run; a refusal is one line and changes nothing."""
    try:
        if not policies or not fractions or not formats:
            raise KvvizError("choose at least one policy, one budget and one cache format")
        schemes = [None if name == CACHES[0] else name for name in formats]
        for name in filter(None, schemes):
            run_cache(name)  # refused in one line before anything runs
        if chosen == UPLOAD:
            if upload is None:
                raise KvvizError("upload a JSONL prompt file, or choose a built-in set")
            prompts = uploaded_prompts(upload.name, upload.getvalue(), limit)
        else:
            prompts = load_prompts(chosen, limit)
        presses = any(is_press(name, classes) for name in policies)
        budgets = [kept_fraction(float(f), presses) for f in sorted(fractions)]
        cases = cases_for(prompts, policies, budgets, mode, 1, new_tokens, schemes)
        session = state.session()
        refuse_too_long(session.lm, prompts, new_tokens)  # before the memory it would need is asked for
        state.make_room(max(held_slots(session.lm, list(p.turns), p.max_new_tokens or new_tokens) for p in prompts)
                        * min(BATCH, len(policies) * len(budgets) * len(schemes)))
    except KvvizError as exc:
        warn(exc)
        return
    lm, source = session.lm, upload.name if chosen == UPLOAD else chosen
    label = f"Sweeping {plural(len(cases), 'case')} ({plural(len(prompts), 'prompt')} of {source})"

    def done(rows: list[dict]) -> None:
        state.keep_sweep(usable(frame(rows), name=f"this page's sweep of {source}"))
        state.notify(f"The sweep ran {plural(len(rows), 'case')} on {lm.name}; its table is below.", note=True)

    hand_over(Work(label, lambda progress: run_cases(lm, cases, BATCH, progress), done))
