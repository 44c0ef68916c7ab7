"""The page's state has two writers (no model): app/state.py and app/persistence.py are the only code that writes
``st.session_state`` (widgets write their own keys, as Streamlit's do); every other module reads it or calls them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {ROOT / "app" / "state.py", ROOT / "app" / "persistence.py"}
ITEM = r"st\.session_state(?:\.\w+|\[[^\]]+\])"
WRITE = re.compile(  # an assignment (also one of several targets), an update, a pop, a delete, an alias
    rf"^\s*{ITEM}(?:\s*,\s*[\w.\[\]\"']+)*\s*=[^=]|^\s*[\w.\[\]\"', ]+=\s*{ITEM}\s*=[^=]"
    rf"|st\.session_state(?:\.\w+)?\.(?:pop|setdefault|update|clear|__setitem__|__delitem__)\(|\bdel\s+{ITEM}"
    rf"|=\s*st\.session_state\s*(?:,|$)")


def writes(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
            if WRITE.search(line)]


def test_only_state_and_persistence_write_the_page_state():
    others = [p for p in (ROOT / "app").rglob("*.py") if p not in OWNERS]
    assert len(others) > 20
    found = [w for p in others for w in writes(p)]
    assert not found, found
    assert len([w for p in OWNERS for w in writes(p)]) > 20  # the finder sees their writes


def test_the_finder_sees_every_kind_of_write(tmp_path):
    planted = tmp_path / "view.py"
    lines = ["st.session_state.layer = 3", 'st.session_state["open_view"] = "x"', "st.session_state.a, b = 1, 2",
             "x = st.session_state.at_jump = 4", 'st.session_state.pop("long_work", None)',
             'st.session_state.setdefault("k", 1)', "del st.session_state.k", "ss = st.session_state",
             "ss, draft = st.session_state, other"]
    reads = ["layer = st.session_state.layer", 'if st.session_state.get("large"):', "st.session_state.layer == 3",
             'cells = st.session_state["heads"].selection.get("cell")']
    planted.write_text("\n".join(lines + reads))
    found = [line for line in planted.read_text().splitlines() if WRITE.search(line)]
    assert found == lines, found
