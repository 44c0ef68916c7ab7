"""User policies: ``KVVIZ_POLICIES`` names extra :class:`~kvviz.policies.base.Policy` classes for the CLI and the app.

Entries are separated by commas: ``package.module:Class``, ``path/to/file.py:Class``, or a module or ``.py`` file
alone (every named Policy subclass defined there). A class needs a ``name`` and defaults for all its fields (they become widgets).
Anything wrong — a module that does not exist or raises on import, a class that is not a Policy — is refused with one
line naming the entry.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path

from kvviz import settings
from kvviz.errors import KvvizError
from kvviz.policies.base import Policy

VARIABLE = "KVVIZ_POLICIES"


def _module(spec: str):
    """Import a module by dotted name or from a ``.py`` file."""
    try:
        if spec.endswith(".py"):
            path = Path(spec).expanduser()
            if not path.is_file():
                raise KvvizError(f"{VARIABLE}: no file {path}")
            name = f"kvviz_user_policies_{abs(hash(str(path.resolve())))}"
            loader = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module  # dataclasses look their module up while the file runs
            loader.loader.exec_module(module)
            return module
        return importlib.import_module(spec)
    except KvvizError:
        raise
    except Exception as exc:
        raise KvvizError(f"{VARIABLE}: cannot import {spec} ({type(exc).__name__}: {exc})") from None


def _checked(cls: object, entry: str) -> type[Policy]:
    if not (isinstance(cls, type) and issubclass(cls, Policy) and dataclasses.is_dataclass(cls)):
        raise KvvizError(f"{VARIABLE}: {entry} is not a Policy dataclass (subclass kvviz.policies.Policy)")
    if not cls.name:
        raise KvvizError(f"{VARIABLE}: {entry} has no name (set name = \"...\" on the class)")
    try:
        cls()
    except Exception as exc:
        raise KvvizError(f"{VARIABLE}: {entry} cannot be made with its defaults ({type(exc).__name__}: {exc})") from None
    return cls


def load(value: str | None = None) -> dict[str, type[Policy]]:
    """The user policies named by ``value`` (default: the ``KVVIZ_POLICIES`` environment variable), by name."""
    value = (settings.text(VARIABLE) or "") if value is None else value
    found: dict[str, type[Policy]] = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        spec, _, attribute = entry.rpartition(":") if ":" in entry and not entry.endswith(".py") else (entry, "", "")
        module = _module(spec)
        if attribute:
            if not hasattr(module, attribute):
                raise KvvizError(f"{VARIABLE}: {spec} has no {attribute}")
            classes = [_checked(getattr(module, attribute), entry)]
        else:
            classes = [_checked(c, f"{entry}:{n}") for n, c in vars(module).items()
                       if isinstance(c, type) and issubclass(c, Policy) and c.__module__ == module.__name__ and c.name]
            if not classes:
                raise KvvizError(f"{VARIABLE}: {entry} defines no Policy subclass with a name")
        found.update({c.name: c for c in classes})
    return found


def available(value: str | None = None) -> dict[str, type[Policy]]:
    """Built-in policies and the user's (a user policy may not take a built-in's name)."""
    from kvviz.policies import POLICIES

    user = load(value)
    clash = sorted(set(user) & set(POLICIES))
    if clash:
        raise KvvizError(f"{VARIABLE}: {', '.join(clash)} is already a built-in policy; choose another name")
    return {**POLICIES, **user}
