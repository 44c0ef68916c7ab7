"""Shared fixtures. The real bundled model is loaded once per test session and shared, as in the app."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvviz.model import LoadedModel, load_model, resolve_checkpoint

# the app autosaves sessions; tests keep theirs out of the user's cache folder
os.environ.setdefault("KVVIZ_SESSIONS", tempfile.mkdtemp(prefix="kvviz-test-sessions-"))
# the suite's references and tolerances are CPU fp32's, also on a machine with a GPU (tests/test_cuda.py covers CUDA)
os.environ.setdefault("KVVIZ_DEVICE", "cpu")


@pytest.fixture(scope="session")
def lm() -> LoadedModel:
    """The bundled SmolLM2-135M, loaded through kvviz (recording attention installed)."""
    return load_model()


@pytest.fixture(scope="session")
def eager_model():
    """An independent reference: the same weights with transformers' eager attention (no kvviz code involved)."""
    folder, _ = resolve_checkpoint(None)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    return model.eval().requires_grad_(False)


def full_forward(model, ids: list[int], **kwargs):
    """One forward over ``ids`` without any cache."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False, **kwargs)
