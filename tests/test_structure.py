"""The code's shape: no import cycles among kvviz's modules (imports inside functions count too), the library never
imports streamlit, modules stay short, and nothing points outside the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450  # one concept per file may be long; split by concept, never by size


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in it (``from a import b`` counts ``a.b`` when that
    is a module, else ``a``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                      for a in node.names}
    return found & known


def graph(package: str) -> dict[str, set[str]]:
    files = {module_name(p): p for p in (ROOT / package).rglob("*.py")}
    known = set(files)
    return {name: imports(path, known) - {name} for name, path in files.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that ends where it starts), or None. A package's ``__init__`` importing its own
    submodules is not a cycle by itself; it is one only through another module."""
    done, stack = set(), []

    def visit(node: str) -> list[str] | None:
        if node in stack:
            return stack[stack.index(node):] + [node]
        if node in done:
            return None
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target.startswith(node + "."):  # a package importing its own submodule
                continue
            found = visit(target)
            if found:
                return found
        stack.pop()
        done.add(node)
        return None

    return next(filter(None, (visit(node) for node in sorted(edges))), None)


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"p": {"p.x"}, "p.x": set()}) is None


def test_no_import_cycles_in_the_library_app_and_benchmarks():
    for package in ("kvviz", "app", "benchmarks"):
        assert cycle(graph(package)) is None, f"{package}: {' → '.join(cycle(graph(package)))}"


def test_the_library_never_imports_streamlit_and_policies_depend_on_nothing_above_them():
    for path in (ROOT / "kvviz").rglob("*.py"):
        assert not re.search(r"^\s*(import|from)\s+streamlit", path.read_text(), re.M), path
    edges = graph("kvviz")
    for name, targets in edges.items():
        if name.startswith("kvviz.policies"):
            assert not {t for t in targets if t.startswith(("kvviz.whatif", "kvviz.figures", "kvviz.cli"))}, name


def imported_names(path: Path) -> set[str]:
    """Every module name ``path`` imports (absolute imports), as written."""
    nodes = list(ast.walk(ast.parse(path.read_text())))
    return ({alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names}
            | {node.module for node in nodes if isinstance(node, ast.ImportFrom) and node.module and not node.level})


def test_tooling_never_imports_the_test_package():
    """The library, the app, the benchmark and the scripts run without ``tests/`` (what they share lives in
    ``kvviz.tiny_models`` and ``benchmarks.browser``)."""
    tooling = [p for d in ("kvviz", "app", "benchmarks", "scripts") for p in (ROOT / d).rglob("*.py")]
    assert len(tooling) > 50
    offenders = {str(p.relative_to(ROOT)): hits for p in tooling
                 if (hits := sorted(n for n in imported_names(p) if n == "tests" or n.startswith("tests.")))}
    assert not offenders, offenders
    assert "kvviz.tiny_models" in imported_names(ROOT / "tests" / "test_sliding_window.py")  # the finder sees them


def test_modules_are_short():
    long = [f"{p.relative_to(ROOT)} ({n})" for p in [*(ROOT / "kvviz").rglob("*.py"), *(ROOT / "app").rglob("*.py")]
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, long


def test_nothing_points_outside_the_repository():
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "kvviz").rglob("*.py"),
             *(ROOT / "app").rglob("*.py"), *(ROOT / "tests").glob("*.py")]
    outside = re.compile("|".join([r"\.\./" + "shared", "seed" + " §", "kv" + "-math"]))  # spelt apart: not a hit here
    assert not [str(p.relative_to(ROOT)) for p in texts if outside.search(p.read_text())]


def test_the_module_map_matches_the_tree():
    """The module map (docs/architecture.md) names every module of kvviz/, app/ and benchmarks/ (one line each, path
    first) and nothing else."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## Module map"):]
    block = block[: block.index("```", block.index("```") + 3)]
    named = set(re.findall(r"^((?:kvviz|app|benchmarks)/[\w/]+\.py)\b", block, re.M))
    actual = {str(p.relative_to(ROOT)) for d in ("kvviz", "app", "benchmarks") for p in (ROOT / d).rglob("*.py")
              if p.name != "__init__.py"}
    assert named == actual, (sorted(named - actual), sorted(actual - named))


def test_the_readme_python_example_runs(lm, monkeypatch, capsys):
    """The README's notebook-style example uses only the public API and runs as written (its model load returns the
    session's already loaded model)."""
    import kvviz

    text = (ROOT / "README.md").read_text()
    start = text.index("```python") + len("```python")
    code = text[start: text.index("```", start)]
    monkeypatch.setattr(kvviz, "load_model", lambda *args, **kwargs: lm, raising=False)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2] == "torch.Size([30, 9])" and printed[-1].endswith("bytes")
