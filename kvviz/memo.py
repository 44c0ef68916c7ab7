"""Derived data of one session (attention rows, the what-if's kept full runs, the page's last what-if), kept until the
session's cache changes. One rule for all of it: everything is dropped when the session's ``version`` moves; within
a version each kind keeps its most recent entries (all, or at most ``keep``). :attr:`Memo.lasting` holds what its
owner validates itself and extends across versions (the attention received so far); :meth:`Memo.clear` drops it too."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np
import torch

T = TypeVar("T")


class Memo:
    """Values by ``(kind, key)`` for one cache version."""

    def __init__(self) -> None:
        self.version: int | None = None
        self._kinds: dict[str, dict[Hashable, Any]] = {}
        self.lasting: dict[str, Any] = {}  # kept when the version moves: each entry says itself what it is valid for

    def get(self, version: int, kind: str, key: Hashable, compute: Callable[[], T], keep: int | None = None) -> T:
        """The value of ``(kind, key)`` at cache ``version``, computed once; a kind keeps its ``keep`` most recently
        used entries (all when None)."""
        if version != self.version:
            self._kinds.clear()
            self.version = version
        entries = self._kinds.setdefault(kind, {})
        if key in entries:
            entries[key] = entries.pop(key)  # most recently used last
            return entries[key]
        value = compute()
        entries[key] = value
        while keep is not None and len(entries) > keep:
            del entries[next(iter(entries))]
        return value

    def peek(self, version: int, kind: str, key: Hashable) -> Any | None:
        """The value of ``(kind, key)`` if it is kept for cache ``version``, else None (nothing is computed)."""
        return self._kinds.get(kind, {}).get(key) if version == self.version else None

    def entries(self, kind: str) -> dict[Hashable, Any]:
        """The entries of ``kind`` kept now (for inspection), oldest first."""
        return dict(self._kinds.get(kind, {}))

    def clear(self) -> None:
        """Drop everything, :attr:`lasting` too (the next reads recompute)."""
        self._kinds.clear()
        self.lasting.clear()

    def nbytes(self) -> int:
        """Bytes of the tensors and arrays held (each storage counted once), for memory accounting."""
        return held_bytes((self._kinds, self.lasting))


def held_bytes(value: Any, seen: set[int] | None = None, depth: int = 6) -> int:
    """Bytes of the torch tensors and numpy arrays reachable from ``value`` through containers, dataclasses and
    plain objects' attributes (``depth`` levels; each storage once)."""
    seen = set() if seen is None else seen
    if depth < 0 or id(value) in seen or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return 0
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    else:
        children = list(getattr(value, "__dict__", {}).values())
    return sum(held_bytes(child, seen, depth - 1) for child in children)
