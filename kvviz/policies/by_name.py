"""Policies from their names and text parameters (the command line's ``--param NAME=VALUE``, the app's widgets)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kvviz.errors import USER_CODE_ERRORS, KvvizError, failure
from kvviz.numbers import number
from kvviz.policies.base import Policy


def policy_named(classes: Mapping[str, type[Policy]], name: str, params: Mapping[str, object] | None = None) -> Policy:
    """``classes[name]`` with ``params`` (text values are converted to the type of the field's default)."""
    if name not in classes:
        raise KvvizError(f"unknown policy {name!r}; choose one of {', '.join(classes)}")
    cls = classes[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in (params or {}).items():
        if key not in fields:
            raise KvvizError(f"{name} has no parameter {key!r}; its parameters: {', '.join(fields) or 'none'}")
        values[key] = _parsed(name, key, value, fields[key].default) if isinstance(value, str) else value
        if isinstance(values[key], (int, float)) and not isinstance(values[key], bool):  # finite in float32, not NaN
            values[key] = number(values[key], f"{name}'s {key}", integer=isinstance(values[key], int))
    try:
        return cls(**values)
    except KvvizError:
        raise
    except USER_CODE_ERRORS as exc:
        raise KvvizError(f"cannot make policy {name}: {failure(exc)}") from None


def _parsed(name: str, key: str, text: str, default: object) -> object:
    """A parameter typed on the command line, read as the type of its default (any number when there is none)."""
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise KvvizError(f"{name}'s {key} must be true or false, got {text!r}")
        return text.lower() in ("true", "1", "yes")
    kinds = [type(default)] if isinstance(default, (int, float, str)) else [int, float, str]
    for kind in kinds:
        if kind is str:
            return text
        try:
            kind(text)
        except ValueError:
            continue
        return number(text, f"{name}'s {key}", integer=kind is int)  # NaN, inf and 1e39 refused here
    kind = {"int": "an integer", "float": "a number", "str": "text"}[kinds[0].__name__]
    raise KvvizError(f"{name}'s {key} must be {kind}, got {text!r}")

