"""A policy from its name and parameters, as the command line, the app's pickers, sweeps and scenarios build one:
kvviz's own policies and the user's (``KVVIZ_POLICIES``, press files) from ``classes``
(:func:`kvviz.policies.user.available`), kvpress' presses as ``kvpress:NAME`` with kvpress' argument names."""

from __future__ import annotations

from collections.abc import Mapping

from kvviz.errors import KvvizError
from kvviz.policies.base import Policy
from kvviz.policies.by_name import policy_named


def make_policy(classes: Mapping[str, type[Policy]], name: str, params: Mapping[str, object] | None = None) -> Policy:
    """``classes[name]`` with ``params`` (text values are converted to the type of the field's default); a kvpress
    press as ``kvpress:NAME`` with kvpress' argument names (:func:`~kvviz.policies.kvpress.presses.from_kvpress`;
    ``AdaKVPress`` wraps SnapKV unless ``press`` says otherwise)."""
    if name.startswith("kvpress:"):
        from kvviz.policies.kvpress.presses import from_kvpress

        press, params = name.removeprefix("kvpress:"), dict(params or {})
        if press == "KeyRerotationPress":
            raise KvvizError("kvpress:KeyRerotationPress re-rotates the wrapped press's kept keys: name that press and "
                             "set the positions to rerotated (policy-run takes --policy kvpress:KeyRerotationPress)")
        if press == "AdaKVPress":
            params.setdefault("press", "SnapKVPress")
        return from_kvpress(press, classes, **params).policy
    return policy_named(classes, name, params)
