"""Errors kvviz raises for bad input. Each message says what was wrong and how to fix it, in one line."""


class KvvizError(ValueError):
    """Bad input: the operation was refused and nothing was changed."""


class ModelLoadError(KvvizError):
    """The model could not be found or read."""
