"""Choosing a policy in the app: the built-ins, ``KVVIZ_POLICIES``' and kvpress' presses by their own names
(``kvpress:SnapKVPress``, kvviz.policies.kvpress.presses), each with one widget per parameter."""

from __future__ import annotations

from dataclasses import fields


from app.plain import warn
from kvviz.errors import KvvizError
from kvviz.policies import POLICIES, Policy
from kvviz.policies.kvpress import presses as kvpress
from kvviz.policies.kvpress.own_code import PressCode
from kvviz.policies.base import Ratio
from kvviz.policies.user import available
from kvviz.policies.registry import make_policy

PRESS = "kvpress:"


def policy_classes() -> dict[str, type[Policy]]:
    """Built-in and ``KVVIZ_POLICIES`` policies; with a bad ``KVVIZ_POLICIES``, its one-line refusal and the
    built-ins."""
    try:
        return available()
    except KvvizError as exc:
        warn(exc)
        return dict(POLICIES)


def names(classes: dict[str, type[Policy]]) -> list[str]:
    """What a policy menu offers: kvviz's policies, then kvpress' presses as ``kvpress:NAME``."""
    return [*classes, *(PRESS + name for name in kvpress.names())]


def is_press(name: str, classes: dict[str, type[Policy]] | None = None) -> bool:
    """Whether ``name`` is a kvpress press: one of kvpress' by name, or (with ``classes``) a press class of the
    user's, run by its own code."""
    return name.startswith(PRESS) or (classes is not None and isinstance(classes.get(name), type)
                                      and issubclass(classes[name], PressCode))


def parameters(column, classes: dict[str, type[Policy]], name: str, key: str) -> dict[str, int | float | str | bool]:
    """One widget per parameter of policy ``name`` in ``column`` — a press's under kvpress' argument names, with the
    values that reproduce it — a toggle for a flag, a menu for a choice, a number otherwise; their values by name."""
    if is_press(name):
        items = [(argument, default, None) for argument, default in kvpress.defaults(name[len(PRESS):]).items()]
    else:
        items = [(f.name, f.default, f.metadata.get("choices")) for f in fields(classes[name])
                 if not f.metadata.get("hidden")]  # a press policy's press object
    values = {}
    for parameter, default, choices in items:
        label, widget = f"{name}: {parameter}", f"{key}-{name}-{parameter}"
        if isinstance(default, bool):
            values[parameter] = column.toggle(label, value=default, key=widget)
        elif isinstance(default, str):
            values[parameter] = column.selectbox(label, choices or (default,), key=widget)
        else:
            step = 1 if isinstance(default, int) else 0.05
            values[parameter] = column.number_input(label, value=default, step=step, key=widget)
    return values


def build(classes: dict[str, type[Policy]], name: str, values: dict) -> Policy:
    """The policy ``name`` with the parameter ``values`` (:func:`parameters`'); refuses bad ones in one line."""
    return make_policy(classes, name, values)


def kept_fraction(fraction: float, presses: bool) -> float:
    """A fraction of the slots kept, as a budget: with a kvpress press in play, kvpress' compression ratio
    ``1 − fraction`` rounded as kvpress rounds (:class:`~kvviz.policies.base.Ratio`)."""
    return Ratio(round(1 - fraction, 9)) if presses and fraction < 1 else float(fraction)
