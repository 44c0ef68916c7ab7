"""kvviz in a notebook: rich output for the library's objects (:mod:`kvviz.notebook.reprs`) and a live widget on a
session (:mod:`kvviz.notebook.cache_widget`)."""

from kvviz.notebook.reprs import html
from kvviz.notebook.cache_widget import CacheWidget, widget

__all__ = ["CacheWidget", "html", "widget"]
