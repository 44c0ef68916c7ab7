"""Settings (no model): every KVVIZ_* variable is read by kvviz/settings.py alone, each is in docs/settings.md's
table, and a number that is not one is refused in one line naming the variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvviz import settings
from kvviz.errors import KvvizError

ROOT = Path(__file__).resolve().parents[2]
READ = re.compile(r"\benviron\s*(\.get\s*\(|\[)|\bgetenv\s*\(")  # a read; os.environ.setdefault and copies are not


def readers(paths: list[Path]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{n}" for p in paths for n, line in enumerate(p.read_text().splitlines(), 1)
            if READ.search(line)]


def test_only_the_settings_module_reads_the_environment():
    code = [p for d in ("kvviz", "app") for p in (ROOT / d).rglob("*.py") if p != ROOT / "kvviz" / "settings.py"]
    assert len(code) > 100 and not readers(code)
    assert readers([ROOT / "kvviz" / "settings.py"])  # the finder sees the one module that reads
    assert READ.search('path = os.environ.get("KVVIZ_MODEL")') and READ.search('os.environ["KVVIZ_X"]')
    assert not READ.search('env = {**os.environ, "KVVIZ_SESSIONS": folder}')


def test_every_variable_named_in_the_code_is_a_setting_in_the_table():
    named = {m for d in ("kvviz", "app", "benchmarks", "scripts") for p in (ROOT / d).rglob("*.py")
             for m in re.findall(r"\bKVVIZ_[A-Z_]+\b", p.read_text())}
    assert named == set(settings.SETTINGS), named ^ set(settings.SETTINGS)
    table = re.findall(r"^\| `(KVVIZ_[A-Z_]+)` \| (.+?) \|", (ROOT / "docs" / "settings.md").read_text(), re.M)
    assert dict(table) == {s.name: s.default for s in settings.SETTINGS.values()}


def test_values_are_read_when_asked(monkeypatch):
    monkeypatch.setenv("KVVIZ_SWEEPS", " a , ,b ")
    monkeypatch.setenv("KVVIZ_MODEL", "  ")
    monkeypatch.setenv("KVVIZ_ALLOW_REMOTE", "1")
    monkeypatch.setenv("KVVIZ_GC_SECONDS", "2.5")
    assert settings.listed("KVVIZ_SWEEPS") == ["a", "b"] and settings.text("KVVIZ_MODEL") is None
    assert settings.switched_on("KVVIZ_ALLOW_REMOTE") and settings.number("KVVIZ_GC_SECONDS", 30) == 2.5
    monkeypatch.delenv("KVVIZ_GC_SECONDS")
    assert settings.number("KVVIZ_GC_SECONDS", 30) == 30
    with pytest.raises(KeyError):
        settings.text("KVVIZ_UNKNOWN")


@pytest.mark.parametrize("value", ["abc", "nan", "0", "-5", "1e39", "inf"])
def test_a_bad_number_is_refused_in_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("KVVIZ_MEMORY_BUDGET_MB", value)
    with pytest.raises(KvvizError, match="^KVVIZ_MEMORY_BUDGET_MB must be [^\n]+$"):
        settings.check()
