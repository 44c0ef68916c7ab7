"""The policy a wrapper (ChunkKV, CriticalKV) scores with, by name."""

from __future__ import annotations

from kvviz.policies.base import Policy
from kvviz.policies.by_name import policy_named


def inner_policy(name: str) -> Policy:
    """The policy a wrapper (ChunkKV, CriticalKV) scores with: a built-in kvviz policy by ``name`` with its defaults,
    or kvpress' press ``kvpress:NAME`` as kvviz reproduces it."""
    if name.startswith("kvpress:"):
        from kvviz.policies.kvpress.presses import from_kvpress

        return from_kvpress(name.removeprefix("kvpress:")).policy
    from kvviz.policies import POLICIES

    return policy_named(POLICIES, name)
