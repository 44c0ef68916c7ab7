"""Finding and loading models, without the bundled weights: dtypes, clear messages for bad paths, folders holding only
pickled weights, truncated GGUF files."""

from __future__ import annotations

import pytest
import torch

from kvviz.errors import ModelLoadError
from kvviz.model import bundled_gguf, converted_dir, load_model, pick_device


def test_dtype_can_be_chosen_and_a_wrong_one_is_refused(monkeypatch):
    monkeypatch.delenv("KVVIZ_DTYPE", raising=False)
    assert pick_device("cpu") == (torch.device("cpu"), torch.float32)
    assert pick_device("cpu", torch.bfloat16) == (torch.device("cpu"), torch.bfloat16)
    monkeypatch.setenv("KVVIZ_DTYPE", "float16")
    assert pick_device("cpu") == (torch.device("cpu"), torch.float16)
    for wrong in ("int8", "float48", "bool"):
        with pytest.raises(ModelLoadError, match="unknown dtype"):
            pick_device("cpu", wrong)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing", "does not exist"),
        (lambda d: d, "has no config.json"),
        (lambda d: (d / "weights.bin").write_bytes(b"x") and d / "weights.bin", "is not a .gguf file"),
        (lambda d: (d / "fake.gguf").write_bytes(b"NOPE" * 10) and d / "fake.gguf", "is not a GGUF file"),
    ],
)
def test_bad_model_paths_fail_with_a_clear_message(tmp_path, make, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model(make(tmp_path))


def test_folder_with_pickle_weights_only_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(tmp_path)


def test_truncated_gguf_is_refused_and_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_CACHE", str(tmp_path / "cache"))
    truncated = tmp_path / "cut.gguf"
    with bundled_gguf().open("rb") as handle:
        truncated.write_bytes(handle.read(1 << 20))
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(truncated)
    assert not converted_dir(truncated).exists()
    assert list((tmp_path / "cache").iterdir()) == []  # the staging folder was removed
