"""Sidebar: model and device, generation settings, demos, export / import, presentation mode."""

from __future__ import annotations


import streamlit as st

from app import persistence, state
from app.components.scroll import look_at
from app.views import tour
from app.views.whatif import CHARTS
from app.plain import plain
from app.progress import long_progress
from kvviz import settings
from kvviz.errors import KvvizError
from kvviz.model import BUNDLED, LoadedModel, allowed_models
from kvviz.sampling import Sampling
from kvviz.scenarios import demo_view, load_scenarios, run_policy_scenario, run_scenario, toy_example


def render() -> None:
    session = state.session()
    lm = session.lm
    with st.sidebar:
        models = allowed_models()
        if len(models) > 1:  # the server's allow-list (KVVIZ_MODELS): each page may use another, each loaded once
            current = state.model_path() or settings.text("KVVIZ_MODEL") or BUNDLED
            chosen = st.selectbox("Model", models, index=models.index(current) if current in models else 0,
                                  help="the models this server offers (KVVIZ_MODELS); switching starts a new "
                                       "conversation on this page")
            if chosen != current:
                state.choose_model(chosen)
                st.rerun()
        st.caption(f"**Model** {plain(lm.name)}")
        st.caption(f"**Device** {lm.device_label}")
        if settings.switched_on("KVVIZ_ALLOW_MODEL_PATHS"):  # off by default: the page cannot make the server read paths
            path = st.text_input("Model path (checkpoint folder or .gguf on the server)")
            if path and st.button("Load this model"):
                state.choose_model(path)
                st.rerun()
        st.toggle("Presentation mode (large type)", key="large")
        st.slider("Max new tokens", 1, 512, key="max_new_tokens")
        with st.expander("Sampling"):
            sampling = session.sampling  # a session file may hold values past the widgets' ranges: start inside them
            temperature = st.slider("Temperature (0 = greedy)", 0.0, 2.0, min(sampling.temperature, 2.0), 0.05)
            top_p = st.slider("Top-p", 0.05, 1.0, max(sampling.top_p, 0.05), 0.05)
            seed = st.number_input("Seed", 0, 2**31 - 1, min(sampling.seed, 2**31 - 1))
            if st.button("New conversation with these settings"):
                persistence.new_conversation(lm, Sampling(temperature, top_p, int(seed)))
                st.rerun()
        if st.button("New conversation"):
            persistence.new_conversation(lm, session.sampling)
            st.rerun()
        _scenarios(lm)
        tour.choose(lm)
        _export_import(lm)


def _scenarios(lm: LoadedModel) -> None:
    st.subheader("Demos")
    for scenario in load_scenarios():
        if st.button(scenario.name, help=scenario.description, key=f"demo-{scenario.name}"):
            if scenario.toy:
                state.keep("toy", (scenario, [toy_example(scenario.toy["alpha"], e) for e in scenario.toy["evict"]]))
            else:
                with st.spinner(plain(f"Running “{scenario.name}”…")):
                    session, draft, answer_step = run_scenario(lm, scenario)
                if scenario.policy_run:
                    with long_progress(plain(f"“{scenario.name}”: the full cache and the policy side by side"),
                                       "forward passes", "stop-demo") as progress:
                        state.keep_policy_run(*run_policy_scenario(lm, scenario, progress))
                view = demo_view(session, draft, answer_step, scenario) if draft.evicted else None
                state.replace(session, draft, at=answer_step)
                if view is not None:  # the views that tell the demo's story
                    state.choose_head(view["layer"], view["head"], whole_page=False)  # the whole page runs already
                    state.show_in_views(view["continuation"], CHARTS["alpha"])  # that head's weights, α and α′
                state.notify(scenario.description, note=True)
                look_at("strip")
            st.rerun()


def _export_import(lm: LoadedModel) -> None:
    st.subheader("Save and share")
    st.caption("Saved automatically: reloading this page restores it.")
    st.download_button("Export session (JSON)", persistence.export_json(), file_name="kvviz-session.json",
                       mime="application/json", on_click="ignore")
    upload = st.file_uploader("Import session", type=["json"], key=state.upload_key())
    if upload is not None and st.button("Load it"):
        state.clear_upload()  # loaded or refused, the file is not kept: a later refused upload cannot leave it behind
        try:
            session, draft, view = persistence.load(lm, upload.getvalue(), "Importing the session")
        except KvvizError as exc:
            state.notify(str(exc))  # shown at the top of the page, after the rerun that empties the uploader
            st.rerun()
        state.replace(session, draft, view)
        st.rerun()
