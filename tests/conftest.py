"""Shared fixtures. The real bundled model is loaded once per test session and shared, as in the app."""

from __future__ import annotations

import copy
import inspect
import os
import re
import tempfile
from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvviz import kv_cache
from kvviz.model import LoadedModel, load_model, resolve_checkpoint
from kvviz.session import Session
from tests.support.rounding import BUNDLED_LOGIT_SCALE, logit_rounding

# the app autosaves sessions; tests keep theirs out of the user's cache folder
os.environ.setdefault("KVVIZ_SESSIONS", tempfile.mkdtemp(prefix="kvviz-test-sessions-"))
# the suite's references and tolerances are CPU fp32's, also on a machine with a GPU (tests/test_cuda.py covers CUDA)
os.environ.setdefault("KVVIZ_DEVICE", "cpu")


# The numeric tier: modules whose tests compare floating-point results with a reference under a tolerance argued
# from the arithmetic. scripts/test.sh runs them again under every other ATen CPU capability the machine has and at
# one thread, so a bound that holds only for this CPU's summation order fails here, not on the next machine.
NUMERIC = {f"test_{name}" for name in """math rounding quant model session prefill whatif cache lockstep
    policy_references sliding_window architectures first_token_step received_attention fp8 fp8_static schemes
    quanto_cache hqq_cache pre_rope_keys outlier_schemes channels reshaping policy_positions policy_modes kvpress
    kv_zip cur_critical_kv keydiff_lagkv_chunkkv bit_allocation why policy_run kvpress_code transcript whatif_steps fork
    """.split()}


# The other tiers (docs/tests.md): ``browser`` drives the real app in headless Chromium, ``app`` runs the page under
# Streamlit's AppTest, ``slow`` starts another process (the command line, a server, a Ray cluster, mypy).
STARTS_A_PROCESS = re.compile(r"subprocess\.|\brun\(\s*\"|running_app\(|app_process\(|\bray\b|mypy")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        if module in NUMERIC:
            item.add_marker(pytest.mark.numeric)
        if module.startswith("test_browser"):
            item.add_marker(pytest.mark.browser)
        elif module.startswith(("test_app", "test_autosave")):
            item.add_marker(pytest.mark.app)
        if STARTS_A_PROCESS.search(inspect.getsource(item.function)):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def server():
    """The app on the bundled model, served for one browser test module (its URL)."""
    from benchmarks.browser import running_app

    with running_app() as url:
        yield url


@pytest.fixture(scope="session")
def lm() -> LoadedModel:
    """The bundled SmolLM2-135M, loaded through kvviz (recording attention installed)."""
    return load_model()


@pytest.fixture(scope="session")
def make_chat(lm) -> Callable[..., Session]:
    """``make_chat(prompt, generate=0, steps=0)``: a chat on the bundled model, the prompt prefilled as one user turn,
    then ``generate`` tokens generated (greedy, up to the end of the turn) or ``steps`` decode steps taken. Each one is
    made once per test session and each call returns an independent copy (the model shared), so a test may commit,
    step or release what it gets."""
    made: dict[tuple, Session] = {}

    def make(prompt: str, generate: int = 0, steps: int = 0) -> Session:
        key = (prompt, generate, steps)
        if key not in made:
            session = Session(lm)
            session.add_user_turn(prompt)
            if generate:
                session.generate(generate)
            for _ in range(steps):
                session.step()
            made[key] = session
        original = made[key]
        return copy.deepcopy(original, memo={id(lm): lm} | kv_cache.compact_memo(original.cache))

    return make


@pytest.fixture(scope="session")
def eps(lm) -> float:
    """ε_z: the float32 rounding of the bundled model's logits between two summation orders (tests/support/rounding.py)."""
    return logit_rounding(lm.config, BUNDLED_LOGIT_SCALE)


@pytest.fixture(scope="session")
def eager_model():
    """An independent reference: the same weights with transformers' eager attention (no kvviz code involved)."""
    folder, _ = resolve_checkpoint(None)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    return model.eval().requires_grad_(False)


