"""Text from data (files, the model, the user, exceptions) shown in elements that render Markdown.

``st.warning``, ``st.info`` and friends render Markdown and LaTeX: a quoted file field such as
``![x](http://host/x.png)`` would make the browser fetch that URL. :func:`plain` backslash-escapes every ASCII
punctuation character (CommonMark renders an escaped one literally), so such text shows as typed and runs nothing.
"""

from __future__ import annotations

import re

import streamlit as st

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character


def plain(text: object) -> str:
    """``text`` as Markdown source that renders as the text itself."""
    return _PUNCTUATION.sub(r"\\\1", str(text))


def warn(text: object) -> None:
    """``st.warning`` of text that came from data (rendered literally)."""
    st.warning(plain(text))
