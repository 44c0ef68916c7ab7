"""Shared fixtures. The real bundled model is loaded once per test session and shared, as in the app."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvviz import kv_cache
from kvviz.model import LoadedModel, load_model, resolve_checkpoint
from kvviz.session import Session
from tests.support.browser_page import needs_chromium
from tests.support.rounding import BUNDLED_LOGIT_SCALE, logit_rounding
from tests.support.session_files import valid_session_file  # noqa: F401 (a fixture several tiers share)
from tests.support.sweeps import folder_spec, one_by_one, sweep_spec  # noqa: F401 (fixtures several tiers share)

# the app autosaves sessions; tests keep theirs out of the user's cache folder
os.environ.setdefault("KVVIZ_SESSIONS", tempfile.mkdtemp(prefix="kvviz-test-sessions-"))
# the suite's references and tolerances are CPU fp32's, also on a machine with a GPU (tests/model/test_cuda.py covers
# CUDA)
os.environ.setdefault("KVVIZ_DEVICE", "cpu")


# The tiers are folders (docs/tests.md): each test is marked with its folder's name, so ``-m`` selects a tier as a
# path does. unit: no bundled weights (tensors, tiny random models, files, text); model: the bundled model in-process
# (with unit, the numeric tiers scripts/test.sh runs again under every other ATen CPU capability); app: the page under
# Streamlit's AppTest; process: anything that starts another process; browser: the real app in headless Chromium.
TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "model", "app", "process", "browser")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in one of the tier folders {', '.join(TIERS)}")
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "browser":
            item.add_marker(needs_chromium)


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """The app on the bundled model, served once for every browser test that needs no settings of its own (each
    opens its own browser page, so its own Streamlit session), with a user policy (``tests.support.inputs``'
    ``Newest``) from ``KVVIZ_POLICIES``, and the file that keeps the server's output."""
    from benchmarks.browser import running_app
    from tests.support.inputs import USER_POLICY

    folder = tmp_path_factory.mktemp("server")
    log, policy = folder / "server.log", folder / "mine.py"
    policy.write_text(USER_POLICY)
    with running_app(env={"KVVIZ_POLICIES": f"{policy}:Newest"}, log=log) as url:
        yield url, log


@pytest.fixture(scope="session")
def server(served) -> str:
    """The shared app's URL."""
    return served[0]


@pytest.fixture(scope="session")
def tokenizer():
    """The bundled model's tokenizer alone (no weights loaded), as the tiny random models use it."""
    return AutoTokenizer.from_pretrained(resolve_checkpoint(None)[0])


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
