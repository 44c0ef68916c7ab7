"""User policies: ``KVVIZ_POLICIES`` names extra :class:`~kvviz.policies.base.Policy` classes for the CLI and the app.

Entries are separated by commas: ``package.module:Class``, ``path/to/file.py:Class``, or a module or ``.py`` file
alone (every named Policy subclass defined there, and every kvpress press class: a ``BasePress`` / ``ScorerPress``
subclass runs its own code, :mod:`kvviz.policies.kvpress.own_code`, named by its class). A class needs a ``name`` and defaults for all its fields (they become widgets).
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
from kvviz.errors import USER_CODE_ERRORS, KvvizError, failure
from kvviz.policies.base import Policy

VARIABLE = "KVVIZ_POLICIES"


def _module(spec: str, label: str = VARIABLE):
    """Import a module by dotted name or from a ``.py`` file."""
    try:
        if spec.endswith(".py"):
            path = Path(spec).expanduser()
            if not path.is_file():
                raise KvvizError(f"{label}: no file {path}")
            name = f"kvviz_user_policies_{abs(hash(str(path.resolve())))}"
            loader = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module  # dataclasses look their module up while the file runs
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
        if "kvpress" in sys.modules:  # a press file imported kvpress, which wraps transformers' attention functions
            from kvviz.policies.kvpress.own_code import unpatch

            unpatch()
        return module
    except KvvizError:
        raise
    except USER_CODE_ERRORS as exc:
        raise KvvizError(f"{label}: cannot import {spec} ({failure(exc)})") from None


def is_press(cls: object) -> bool:
    """Whether ``cls`` is a kvpress press class (kvpress' own, or a user's class in its shape) rather than a Policy."""
    return isinstance(cls, type) and not issubclass(cls, Policy) and (
        callable(getattr(cls, "compress", None)) or callable(getattr(cls, "score", None)))


def _checked(cls: object, entry: str, label: str = VARIABLE) -> type[Policy]:
    if is_press(cls):  # a kvpress press runs its own code; its arguments with plain defaults become the fields
        from kvviz.policies.kvpress.own_code import policy_class

        cls = policy_class(cls)
    if not (isinstance(cls, type) and issubclass(cls, Policy) and dataclasses.is_dataclass(cls)):
        raise KvvizError(f"{label}: {entry} is not a Policy dataclass (subclass kvviz.policies.Policy) or a kvpress "
                         "press (a class with compress or score)")
    if not cls.name:
        raise KvvizError(f"{label}: {entry} has no name (set name = \"...\" on the class)")
    try:
        cls()
    except USER_CODE_ERRORS as exc:
        raise KvvizError(f"{label}: {entry} cannot be made with its defaults ({failure(exc)})") from None
    return cls


def load(value: str | None = None, label: str = VARIABLE) -> dict[str, type[Policy]]:
    """The user policies named by ``value`` (default: the ``KVVIZ_POLICIES`` environment variable), by name."""
    value = (settings.text(VARIABLE) or "") if value is None else value
    found: dict[str, type[Policy]] = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        spec, _, attribute = entry.rpartition(":") if ":" in entry and not entry.endswith(".py") else (entry, "", "")
        module = _module(spec, label)
        if attribute:
            if not hasattr(module, attribute):
                raise KvvizError(f"{label}: {spec} has no {attribute}")
            classes = [_checked(getattr(module, attribute), entry, label)]
        else:
            classes = [_checked(c, f"{entry}:{n}", label) for n, c in vars(module).items()
                       if isinstance(c, type) and c.__module__ == module.__name__
                       and (issubclass(c, Policy) and c.name or is_press(c))]
            if not classes:
                raise KvvizError(f"{label}: {entry} defines no Policy subclass with a name")
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
