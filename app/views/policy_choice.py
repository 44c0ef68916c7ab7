"""Choosing a policy in the app: the built-ins, ``KVVIZ_POLICIES``' and kvpress' presses by their own names
(``kvpress:SnapKVPress``), as the policy table lists them (kvviz.policies.registry), each with one widget per
parameter."""

from __future__ import annotations

from app.plain import warn
from kvviz.errors import KvvizError
from kvviz.policies import POLICIES, Policy
from kvviz.policies.base import Ratio
from kvviz.policies.registry import entry, make_policy
from kvviz.policies.user import available


def policy_classes() -> dict[str, type[Policy]]:
    """Built-in and ``KVVIZ_POLICIES`` policies; with a bad ``KVVIZ_POLICIES``, its one-line refusal and the
    built-ins."""
    try:
        return available()
    except KvvizError as exc:
        warn(exc)
        return dict(POLICIES)


def parameters(column, classes: dict[str, type[Policy]], name: str, key: str) -> dict[str, int | float | str | bool]:
    """One widget per parameter of policy ``name`` in ``column`` — a press's under kvpress' argument names, with the
    values that reproduce it — a toggle for a flag, a menu for a choice, a number otherwise; their values by name."""
    values = {}
    for parameter, default, choices in entry(classes, name).parameters:
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
