"""Errors kvviz raises for bad input. Each message says what was wrong and how to fix it, in one line."""


class KvvizError(ValueError):
    """Bad input: the operation was refused and nothing was changed."""


class ModelLoadError(KvvizError):
    """The model could not be found or read."""


USER_CODE_ERRORS = (Exception, SystemExit, GeneratorExit)
"""What a user's code (a policy or press file, its import, its ``score``) may raise that kvviz turns into a refusal
where it calls that code: everything but ``KeyboardInterrupt``, the person's own stop. A ``sys.exit(0)`` in a press
file must not end a command with success and no output."""


def failure(exc: BaseException) -> str:
    """What a user's code raised, in words: ``ValueError: bad shape``, ``it called sys.exit(0)``."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"
