"""Where a sweep's prompts come from: ``builtin:NAME`` (generated, seeded), a kvpress-format dataset (``.parquet``
or JSONL with kvpress' columns) or kvviz's own JSONL (``prompt`` / ``turns``, ``expected``, ``id``)."""

from __future__ import annotations

from pathlib import Path

from kvviz.errors import KvvizError
from kvviz.sweeps import prompts, ruler
from kvviz.sweeps.kvpress_data import is_kvpress_file, read_kvpress
from kvviz.sweeps.prompts import Prompt

BUILTIN = (*prompts.SETS, "all", *ruler.SETS, "ruler")


def check_source(source: str) -> None:
    """Refuse ``source`` at once when it names no built-in set or no file (before anything is loaded)."""
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name not in BUILTIN:
            raise KvvizError(f"no built-in prompt set {name!r}; choose builtin:{', builtin:'.join(BUILTIN)}")
    elif not Path(source).is_file():
        raise KvvizError(f"prompt file {source} does not exist; pass a JSONL or .parquet file or "
                         f"builtin:{', builtin:'.join(BUILTIN)}")


def load_prompts(source: str, limit: int | None = None) -> list[Prompt]:
    """The prompts of ``source`` (a file or ``builtin:NAME``), the first ``limit`` of them if given."""
    check_source(source)
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        found = prompts.builtin(name) if name in (*prompts.SETS, "all") else ruler.ruler_set(name)
    else:
        path = Path(source)
        found = read_kvpress(path) if path.is_file() and is_kvpress_file(path) else prompts.read_jsonl(path)
    return _checked(found, source, limit)


def uploaded_prompts(name: str, data: bytes, limit: int | None = None) -> list[Prompt]:
    """The prompts of an uploaded JSONL file (kvviz's lines: ``prompt`` or ``turns``, ``expected``, ``id``), the
    first ``limit`` of them if given."""
    return _checked(prompts.parse_jsonl(prompts.text_of(data, name), name), name, limit)


def _checked(found: list[Prompt], source: str, limit: int | None) -> list[Prompt]:
    """``found``, refused when empty or when an id names two prompts; the first ``limit`` if given."""
    if not found:
        raise KvvizError(f"{source} holds no prompts")
    ids = [p.id for p in found]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise KvvizError(f"{source}: the id {twice!r} is used twice; ids name the rows of the table")
    return found[:limit] if limit else found
