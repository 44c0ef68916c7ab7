"""The code's shape: every import keeps to the floors of docs/architecture.md's module map and none closes a cycle
(imports inside functions count too), the library never imports streamlit, modules stay short, and nothing points
outside the repository."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 450  # one concept per file may be long; split by concept, never by size


TREE = ("kvviz", "app", "benchmarks", "scripts")
MAP_LINE = re.compile(r"^((?:kvviz|app|benchmarks|scripts)/[\w/]+\.py)\b")
FLOOR_LINE = re.compile(r"^── (\d+) · ")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
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


def graph(package: str | None = None, root: Path = ROOT) -> dict[str, set[str]]:
    """Every module of ``package`` (all of :data:`TREE` when None) and the modules of the tree it imports."""
    files = {module_name(p, root): p for d in TREE for p in (root / d).rglob("*.py")}
    known = set(files)
    return {name: imports(path, known) - {name} for name, path in files.items()
            if package is None or name == package or name.startswith(package + ".")}


def floors(root: Path = ROOT) -> dict[str, int]:
    """Each module's floor as docs/architecture.md's module map gives it (the last ``── N · …`` line above it)."""
    text = (root / "docs" / "architecture.md").read_text()
    block = text[text.index("## Module map"):]
    block = block[: block.index("```", block.index("```") + 3)]
    floor, found = 0, {}
    for line in block.splitlines():
        if heading := FLOOR_LINE.match(line):
            floor = int(heading.group(1))
        elif named := MAP_LINE.match(line):
            found[module_name(root / named.group(1), root)] = floor
    return found


def upward_imports(edges: dict[str, set[str]], floor: dict[str, int]) -> list[str]:
    """Every import that runs to a later floor than its importer's, as ``"a (3) → b (9)"``. A package's
    ``__init__`` may import its own modules, and its other imports keep to the floor of its lowest module; importing a
    package reaches as high as its ``__init__``'s imports do."""
    def home(package: str) -> int:
        return min(f for name, f in floor.items() if name.startswith(package + "."))

    def reach(name: str) -> int:
        if name in floor:
            return floor[name]
        return max([home(name), *(reach(target) for target in edges.get(name, ()))])

    found = []
    for source, targets in edges.items():
        level = floor[source] if source in floor else home(source)
        for target in sorted(targets):
            if source not in floor and target.startswith(source + "."):
                continue  # a package's __init__ importing its own module
            if reach(target) > level:
                found.append(f"{source} ({level}) → {target} ({reach(target)})")
    return found


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


def test_no_import_cycles_in_the_library_app_benchmarks_and_scripts():
    for package in TREE:
        assert cycle(graph(package)) is None, f"{package}: {' → '.join(cycle(graph(package)))}"


def test_no_import_runs_to_a_later_floor():
    """Every import of kvviz/, app/, benchmarks/ and scripts/ keeps to the floors of docs/architecture.md's module map
    (policies and the what-if never import a policy run, the library never imports the app, …)."""
    assert not upward_imports(graph(), floors())


def spread(floor: dict[str, int]) -> dict[str, list[int]]:
    """Each package below the four top folders (``kvviz.quant``, ``app.views``, …) whose modules stand on more than
    one floor, with those floors."""
    packages: dict[str, set[int]] = {}
    for name, level in floor.items():
        package = name.rpartition(".")[0]
        if "." in package:  # not kvviz/, app/, benchmarks/ or scripts/ themselves
            packages.setdefault(package, set()).add(level)
    return {package: sorted(levels) for package, levels in packages.items() if len(levels) > 1}


def test_every_package_keeps_to_one_floor():
    """A folder is one room on one floor (kvviz/quant/ spanned floors 1 to 6 while it held the named schemes,
    knotted with kvviz/edit/); the four top folders span the house."""
    assert not spread(floors())
    assert spread({"kvviz.quant.names": 1, "kvviz.quant.fp4": 3, "kvviz.rope": 3}) == {"kvviz.quant": [1, 3]}


def test_a_planted_upward_import_or_cycle_is_found(tmp_path):
    """The checks above fail on what they guard against: an import inside a function from RoPE (floor 3) into the
    run engine (floor 10), one from a package's ``__init__``, and a cycle they close."""
    for d in TREE:
        shutil.copytree(ROOT / d, tmp_path / d)
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "architecture.md", tmp_path / "docs")
    assert not upward_imports(graph(root=tmp_path), floors(tmp_path))
    with (tmp_path / "kvviz" / "rope.py").open("a") as rope:
        rope.write("\n\ndef _planted():\n    from kvviz.runs.timeline import Timeline\n")
    with (tmp_path / "kvviz" / "quant" / "__init__.py").open("a") as quant:
        quant.write("\nimport kvviz.whatif\n")
    edges = graph(root=tmp_path)
    found = sorted(upward_imports(edges, floors(tmp_path)))
    assert found == ["kvviz.quant (3) → kvviz.whatif (8)", "kvviz.rope (3) → kvviz.runs.timeline (10)"], found
    assert cycle(edges) is not None  # the run engine imports RoPE: the planted import closes a cycle


def test_the_library_never_imports_streamlit():
    for path in (ROOT / "kvviz").rglob("*.py"):
        assert not re.search(r"^\s*(import|from)\s+streamlit", path.read_text(), re.M), path


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
    # the finder sees them
    assert "kvviz.tiny_models" in imported_names(ROOT / "tests" / "unit" / "test_sliding_window.py")


def test_no_test_module_imports_another():
    """What tests share lives in tests/support/ (references, the app under AppTest, a browser page, rounding bounds)
    and in conftest's fixtures, never in a test module or conftest imported as a module."""
    shared = re.compile(r"^(tests\.)?(test_\w+|conftest)$")
    tests = [*(ROOT / "tests").glob("*.py"), *(ROOT / "tests" / "support").glob("*.py")]
    offenders = {p.name: hits for p in tests if (hits := sorted(n for n in imported_names(p) if shared.match(n)))}
    assert not offenders, offenders
    assert shared.match("tests.test_app") and shared.match("conftest") and not shared.match("tests.support.app_test")


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
    """The module map (docs/architecture.md) names every module of kvviz/, app/, benchmarks/ and scripts/ (one line
    each, path first, under its floor) and nothing else."""
    named = set(floors())
    actual = {name for name in graph() if not (ROOT / name.replace(".", "/") / "__init__.py").exists()}
    assert named == actual, (sorted(named - actual), sorted(actual - named))
    assert min(floors().values()) == 1
