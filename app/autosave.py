"""Autosave files: written atomically and owner-only, each with a revision number, never over a newer revision.

A file starts with ``{"revision": N, …}``. A page remembers the revision it read or wrote last; a write that finds
another one on disk (another tab of the same ``?s=`` id saved since) is refused with :class:`Conflict`, so neither
tab's work is lost. Two tabs of one id are two threads of the server process: the check and the write are one step.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from pathlib import Path

REVISION = re.compile(rb'\{"revision": (\d+)')
_locks: dict[Path, threading.Lock] = {}
_locks_lock = threading.Lock()


class Conflict(Exception):
    """The file holds a revision this page did not read or write."""


def revision(text: bytes) -> int:
    """The revision an autosave starts with (0 for a file written before revisions were kept)."""
    match = REVISION.match(text[:64])
    return int(match.group(1)) if match else 0


def revision_of(path: Path) -> int | None:
    """The revision of the file at ``path``, or None when there is none."""
    try:
        with path.open("rb") as handle:
            return revision(handle.read(64))
    except FileNotFoundError:
        return None


def write(path: Path, text: str, known: int | None) -> int:
    """Write the JSON object ``text`` to ``path`` with the next revision, if the file's revision is ``known`` (or
    there is no file); returns the new revision. Folder 0700, file 0600, replaced atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _lock(path):
        on_disk = revision_of(path)
        if on_disk is not None and on_disk != known:
            raise Conflict(path)
        number = (on_disk or 0) + 1
        descriptor, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"revision": number})[:-1] + ", " + text[1:])
        os.replace(staging, path)
    return number


def _lock(path: Path) -> threading.Lock:
    with _locks_lock:
        return _locks.setdefault(path, threading.Lock())
