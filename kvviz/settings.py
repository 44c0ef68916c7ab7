"""Every ``KVVIZ_*`` environment variable kvviz reads, read here and nowhere else; docs/settings.md is their table.

A variable is read each time it is asked for (a server, a test or a benchmark's child process may set it in between);
an empty value counts as unset; a number that is not one is refused in one line naming the variable (never a
traceback). Imports nothing heavy: the command line reads its settings before torch loads."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvviz.numbers import number as checked_number


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # as docs/settings.md states it
    meaning: str
    minimum: float | None = None  # numbers: the lowest value allowed (excluded: numbers must be above it)


SETTINGS = {s.name: s for s in (
    Setting("KVVIZ_MODEL", "the bundled SmolLM2-135M", "the model the app and the CLI load: a folder, a `.gguf` file "
            "or a hub id"),
    Setting("KVVIZ_MODELS", "none", "comma-separated models a page may switch to, beside the bundled one"),
    Setting("KVVIZ_ALLOW_MODEL_PATHS", "off", "`1` shows a model-path box on the page (the page may make the server "
            "read a path)"),
    Setting("KVVIZ_CACHE", "`~/.cache/kvviz`", "where converted models and autosaves live"),
    Setting("KVVIZ_DEVICE", "`cuda` when there is one, else `cpu`", "the device the model runs on"),
    Setting("KVVIZ_DTYPE", "bf16 (fp16) on CUDA, fp32 on CPU", "the model's dtype: `float32`, `bfloat16`, `float16`"),
    Setting("KVVIZ_DEVICE_MAP", "none", "accelerate's `device_map` (`auto` spreads a large model over GPUs)"),
    Setting("KVVIZ_POLICIES", "none", "user policies: comma-separated `module:Class` or `.py` files"),
    Setting("KVVIZ_MEMORY_BUDGET_MB", "4096", "MiB of cache and recorded queries one session may hold", 0),
    Setting("KVVIZ_SERVER_MEMORY_MB", "half the machine's (the GPU's) memory", "MiB all of a server's sessions may "
            "hold together", 0),
    Setting("KVVIZ_IDLE_MINUTES", "15", "minutes after which an idle page's session is released (restored from its "
            "autosave when the page runs again)", 0),
    Setting("KVVIZ_GC_SECONDS", "30", "seconds between the server's collections of closed pages' memory", 0),
    Setting("KVVIZ_SESSIONS", "`$KVVIZ_CACHE/sessions`", "the folder of autosaved sessions"),
    Setting("KVVIZ_SWEEPS", "none", "comma-separated sweep folders the Sweeps tab opens"),
    Setting("KVVIZ_ALLOW_REMOTE", "off", "`1` lets the app serve a non-loopback address"),
)}


def text(name: str) -> str | None:
    """The variable's value, stripped; None where it is unset or empty."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not one of kvviz's settings")
    return os.environ.get(name, "").strip() or None


def listed(name: str) -> list[str]:
    """The variable's comma-separated entries, stripped, empty ones dropped."""
    return [entry.strip() for entry in (text(name) or "").split(",") if entry.strip()]


def switched_on(name: str) -> bool:
    """Whether the variable is ``1``."""
    return text(name) == "1"


def number(name: str, default: float) -> float:
    """The variable as a number above its minimum (``default`` where unset); refuses anything else in one line."""
    value = text(name)
    if value is None:
        return default
    return checked_number(value, name, SETTINGS[name].minimum, above=True)


def check() -> None:
    """Refuse the first numeric variable that is set to something other than a number above its minimum (the app
    checks them all as it starts, so none fails later in a thread or a page's run)."""
    for setting in SETTINGS.values():
        if setting.minimum is not None:
            number(setting.name, 0)
