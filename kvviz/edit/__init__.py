"""Edits of a session's cache: the immutable :class:`~kvviz.edit.edit.Edit` and its parts (evictions, prunings,
merges), the draft clicks build, the check that an edit fits a cache, and the log of committed edits. Each module is
imported by its own name."""
