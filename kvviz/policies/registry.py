"""Every policy by name, in one table: kvviz's own, the user's (``KVVIZ_POLICIES``, a press file's class) and kvpress'
presses as ``kvpress:NAME`` with kvpress' argument names. The command line, the app's pickers, sweeps, scenarios and
the tests read the same table (:func:`entries`) and build from it the same way (:func:`chosen`), as kvpress keeps one
``PRESS_REGISTRY``.

A name is looked up in ``classes`` (:func:`kvviz.policies.user.available`: kvviz's and the user's) unless it starts
with ``kvpress:``; a press's mapping (kvviz.policies.kvpress.presses) also says how kvpress runs it — its ratio, its
mode (``DecodingPress``: after every N decode steps), its positions (``KeyRerotationPress``) — which :func:`chosen`
returns beside the policy for a run to take."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from kvviz.errors import KvvizError
from kvviz.policies.base import Policy, Ratio
from kvviz.policies.by_name import policy_named

PRESS = "kvpress:"


@dataclass(frozen=True)
class Entry:
    """One row of the table: a name, where it comes from, and its parameters with their defaults and choices (a
    press's under kvpress' argument names, with the values kvviz reproduces it with)."""

    name: str
    source: str  # "kvviz", "user" (KVVIZ_POLICIES, a press file) or "kvpress"
    parameters: tuple[tuple[str, object, tuple | None], ...]  # (name, default, choices or None)


@dataclass(frozen=True)
class Chosen:
    """A policy chosen by name, and what its source says about the run: a press's budget (its ``compression_ratio``,
    or DecodingPress' ``target_size`` in slots), mode, positions and interval; a two-stage policy's reader and the
    slots it reads per step (RocketKV); None where it says nothing."""

    policy: Policy
    budget: Ratio | int | None = None
    mode: str | None = None
    positions: str | None = None
    every: int | None = None
    reader: object | None = None
    reads: int | None = None


def names(classes: Mapping[str, type[Policy]]) -> list[str]:
    """What a picker offers, in order: the policies of ``classes`` (kvviz's, then the user's), then kvpress' presses
    as ``kvpress:NAME``."""
    from kvviz.policies.kvpress.presses import names as press_names

    return [*classes, *(PRESS + name for name in press_names())]


def is_press(name: str, classes: Mapping[str, type[Policy]] | None = None) -> bool:
    """Whether ``name`` is a kvpress press: one of kvpress' by name, or (with ``classes``) a press class of the user's,
    run by its own code."""
    from kvviz.policies.kvpress.own_code import PressCode

    cls = None if classes is None else classes.get(name)
    return name.startswith(PRESS) or (isinstance(cls, type) and issubclass(cls, PressCode))


def entries(classes: Mapping[str, type[Policy]] | None = None) -> dict[str, Entry]:
    """The table, by name (default ``classes``: kvviz's own policies)."""
    from kvviz.policies import POLICIES

    classes = POLICIES if classes is None else classes
    return {name: entry(classes, name) for name in names(classes)}


def entry(classes: Mapping[str, type[Policy]], name: str) -> Entry:
    """The row of ``name``; one line naming the choices when there is none."""
    from kvviz.policies import POLICIES

    if name.startswith(PRESS):
        from kvviz.policies.kvpress.presses import defaults

        return Entry(name, "kvpress", tuple((argument, default, None)
                                            for argument, default in defaults(name[len(PRESS):]).items()))
    if name not in classes:
        raise KvvizError(f"unknown policy {name!r}; choose one of {', '.join(classes)}")
    shown = [f for f in dataclasses.fields(classes[name]) if not f.metadata.get("hidden")]  # a press's object: none
    return Entry(name, "kvviz" if POLICIES.get(name) is classes[name] else "user",
                 tuple((f.name, f.default, f.metadata.get("choices")) for f in shown))


def chosen(classes: Mapping[str, type[Policy]], name: str, params: Mapping[str, object] | None = None) -> Chosen:
    """Policy ``name`` of ``classes`` with ``params`` (text values are read as the type of the field's default), or
    kvpress' press ``kvpress:NAME`` with kvpress' argument names as kvviz reproduces it
    (:func:`~kvviz.policies.kvpress.presses.from_kvpress`; ``AdaKVPress`` wraps SnapKV unless ``press`` says
    otherwise), with what the press says about the run."""
    if not name.startswith(PRESS):
        policy = policy_named(classes, name, params)
        reader = getattr(policy, "reader", None)  # RocketKV: the prompt's compression, then a read per step
        return Chosen(policy) if reader is None else Chosen(policy, mode="prefill", reader=reader, reads=policy.topk)
    from kvviz.policies.kvpress.presses import from_kvpress

    press, params = name[len(PRESS):], dict(params or {})
    if press == "AdaKVPress":
        params.setdefault("press", "SnapKVPress")
    made = from_kvpress(press, classes, **params)
    return Chosen(made.policy, made.ratio, made.mode, made.positions, made.every)


def make_policy(classes: Mapping[str, type[Policy]], name: str, params: Mapping[str, object] | None = None) -> Policy:
    """The policy alone of :func:`chosen`, for a step's eviction (no run, so no positions to move:
    ``kvpress:KeyRerotationPress`` is refused in one line)."""
    if name == PRESS + "KeyRerotationPress":
        raise KvvizError("kvpress:KeyRerotationPress re-rotates the wrapped press's kept keys: name that press and "
                         "set the positions to rerotated (policy-run takes --policy kvpress:KeyRerotationPress)")
    return chosen(classes, name, params).policy


def from_file(spec: str, params: Mapping[str, object] | None = None) -> Chosen:
    """The policy class (or kvpress press class, run by its own code) ``spec`` = ``FILE.py:CLASS`` names, made with
    ``params`` (kvpress' argument names); a ``compression_ratio`` among them is the run's budget, and a press compresses
    once after the prompt, as kvpress does."""
    from kvviz.numbers import press_budgets
    from kvviz.policies.user import load

    params, budget = dict(params or {}), None
    if "compression_ratio" in params:
        budget = Ratio(press_budgets(params, "the press")["compression_ratio"])
        del params["compression_ratio"]
    classes = load(spec, label="--press-file")
    return Chosen(policy_named(classes, next(iter(classes)), params), budget, "prefill")
