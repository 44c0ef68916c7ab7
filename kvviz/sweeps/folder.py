"""A sweep folder's files, read and written so that no file is lost or overwritten.

- No file of the folder is read or written through a symbolic link (a folder received from someone else could point
  ``table.csv`` at any file the user can write): such a file is refused, ``rows.jsonl`` is opened with
  ``O_NOFOLLOW``, and the tables and the manifest are written beside their place, then renamed over it.
- One sweep writes a folder at a time: :func:`locked` holds ``sweep.lock`` (``flock``, not waiting), which names the
  holder's pid and is removed when the sweep ends; a second sweep is refused (:func:`refuse_busy` says so before it
  does any work). Readers take no lock.
- A file that cannot be written (a read-only folder, a full disk) is refused in one line naming it; the tables are
  both written beside their places before either is renamed over its old one (:func:`replace_all`).
- Reading never writes: a line of ``rows.jsonl`` that is not a row is reported with its number and kept. Only a
  writer, holding the lock, cuts off a torn last line (one without a newline at its end: a sweep stopped mid-write).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from kvviz.errors import KvvizError

Row = dict[str, object]
ROWS, CSV, PARQUET, MANIFEST, LOCK = "rows.jsonl", "table.csv", "table.parquet", "manifest.json", "sweep.lock"


@dataclass
class RowsFile:
    """What a ``rows.jsonl`` holds: its rows by key (a later line of a key replaces an earlier one) with their line
    numbers, each other line (``PATH:N: why``), and what follows its last newline (``tail``)."""

    present: bool = False
    rows: dict[str, Row] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    damaged: list[str] = field(default_factory=list)
    tail: bytes = b""  # empty when the file ends with a newline
    torn: str = ""  # the tail when it is not a row: where it is and why it is left out

    @property
    def problems(self) -> list[str]:
        """Each line that is not a row, a torn last line last."""
        return self.damaged + [self.torn] * bool(self.torn)


def read_rows(path: Path) -> RowsFile:
    """The rows of ``path`` (a ``rows.jsonl``; none when there is no file) and its lines that are not rows. Reads
    only, never through a symbolic link."""
    data = read_bytes(path)
    found = RowsFile(present=data is not None)
    lines = (data or b"").split(b"\n")
    found.tail = lines[-1]
    for number, line in enumerate(lines if found.tail else lines[:-1], start=1):
        if not line.strip():
            continue
        row, why = _parse_row(line)
        if row is None and number == len(lines):
            found.torn = f"{path}:{number}: torn (no newline at its end: a sweep stopped while writing it, or is)"
        elif row is None:
            found.damaged.append(f"{path}:{number}: {why}")
        else:
            found.rows[row["key"]], found.lines[row["key"]] = row, number
    return found


def _parse_row(line: bytes) -> tuple[Row | None, str]:
    """A line of ``rows.jsonl`` as a row, or None and why it is not one."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:
        return None, f"not JSON ({getattr(exc, 'msg', 'not UTF-8')})"
    if not isinstance(row, dict) or not isinstance(row.get("key"), str):
        return None, f"not a row (a JSON object with a key) but a JSON {type(row).__name__}"
    return row, ""


def make_folder(folder: Path) -> Path:
    """``folder``, made if needed; refused when it is a file or a dangling symbolic link, or when one of a sweep's
    files in it is a symbolic link or not a plain file."""
    if os.path.lexists(folder) and not folder.is_dir():
        kind = "a dangling symbolic link" if folder.is_symlink() and not folder.exists() else "a file"
        raise KvvizError(f"{folder} is {kind}, not a folder; pass another --out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KvvizError(f"cannot make the folder {folder} ({exc.strerror}); pass another --out") from None
    for name in (ROWS, CSV, PARQUET, MANIFEST, LOCK):
        plain_file(folder / name)
    return folder


def plain_file(path: Path) -> None:
    """Refuse ``path`` when it is a symbolic link (written through, it would overwrite the file it names) or
    something other than a plain file; a missing one is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise KvvizError(f"{path} is a symbolic link: a sweep folder's files are read and written only as plain files "
                         "(replace the link by a copy of its file, or pass another --out)")
    if not stat.S_ISREG(mode):
        raise KvvizError(f"{path} is not a plain file (a folder, a pipe, …); move it away or pass another --out")


def read_bytes(path: Path) -> bytes | None:
    """The bytes of the plain file ``path`` (None when there is none), never read through a symbolic link."""
    plain_file(path)
    try:  # no link followed and no pipe waited on, even if one was put there since
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KvvizError(f"cannot read {path} ({exc.strerror})") from None


def replace(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` whole or not at all: into a new file beside it, then renamed over it (a symbolic link there is
    replaced, never written through)."""
    replace_all({path: write})


def replace_all(files: dict[Path, Callable[[BinaryIO], object]]) -> None:
    """Write every file of ``files`` whole or none: each into a new file beside it; only when all are written and on
    disk are they renamed over the old ones (a full disk while writing the second table leaves both old tables)."""
    staged: dict[Path, Path] = {}
    try:
        for path, write in files.items():
            staged[path] = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
            descriptor = _writable(staged[path], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
            with os.fdopen(descriptor, "wb") as handle:
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
        for path, staging in staged.items():
            os.replace(staging, path)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    finally:
        for staging in staged.values():
            staging.unlink(missing_ok=True)


def _writable(path: Path, flags: int) -> int:
    """``os.open(path, flags)``; a folder that refuses it is refused in one line."""
    try:
        return os.open(path, flags, 0o666)
    except OSError as exc:
        raise _unwritable(path, exc) from None


def _unwritable(path: Path, exc: OSError) -> KvvizError:
    return KvvizError(f"cannot write {path} ({exc.strerror or exc}); make room or pass another --out (nothing "
                      "written so far was lost)")


def append(handle: BinaryIO, line: bytes, path: Path) -> None:
    """Append one row's line to ``rows.jsonl`` (open from :func:`appending`) and put it on disk before going on."""
    try:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
    except OSError as exc:
        raise _unwritable(path, exc) from None


@contextmanager
def appending(path: Path, found: RowsFile, warn: Callable[[str], None]) -> Iterator[BinaryIO]:
    """``rows.jsonl`` open to append rows (never through a symbolic link), ending with a newline first: a whole
    last row without one gets it, a torn last line (``found.torn``, said to ``warn``) is cut off. Nothing before
    the last line is touched. Call it holding :func:`locked`, with the rows read under it."""
    descriptor = _writable(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "ab") as handle:
        if found.torn:
            os.ftruncate(descriptor, os.fstat(descriptor).st_size - len(found.tail))
            warn(f"{found.torn}; cut off")
        elif found.tail:
            handle.write(b"\n")
            handle.flush()
        yield handle


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock (``sweep.lock``, which then names this process) while the block runs, or refuse at
    once when another process holds it: one sweep writes a folder at a time. The lock file is removed, still held,
    when the block ends; a sweep that locked a file another had just removed locks the new one instead."""
    path = folder / LOCK
    for _ in range(100):
        descriptor = _writable(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip()
            os.close(descriptor)
            raise _busy(folder, holder) from None
        if _same_file(descriptor, path):
            break
        os.close(descriptor)  # its holder removed it after we opened it: lock the file now there
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)  # still held: a sweep that opened it before finds it gone and opens the next one
        except OSError:
            pass
        os.close(descriptor)  # releases the lock


def tidy_new_folder(folder: Path) -> None:
    """Remove ``folder`` — made by this sweep — if it holds nothing but an empty ``rows.jsonl`` (a sweep that failed
    before its first row); a folder with anything else in it is left as it is."""
    rows = folder / ROWS
    try:
        if os.lstat(rows).st_size == 0 and sorted(os.listdir(folder)) == [ROWS]:
            os.unlink(rows)
        os.rmdir(folder)
    except OSError:  # not empty, or already gone
        pass


def refuse_busy(folder: Path) -> None:
    """Refuse ``folder`` at once when another sweep holds its lock (a check before any work; :func:`locked` makes
    it sure). Creates nothing."""
    try:
        descriptor = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # no lock file (or no folder): nobody holds it
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(folder, os.pread(descriptor, 32, 0).decode(errors="replace").strip()) from None
    finally:
        os.close(descriptor)


def _busy(folder: Path, holder: str) -> KvvizError:
    return KvvizError(f"{folder} is being written by another sweep (pid {holder if holder.isdigit() else '?'}); "
                      "wait for it to finish, or pass another --out")


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        return os.fstat(descriptor).st_ino == os.stat(path, follow_symlinks=False).st_ino
    except FileNotFoundError:
        return False
