"""Rules of the code base that a test can hold by running the code."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Imports every module of engine/ (the worker included) in a fresh interpreter, then lists
#: the Qt bindings that came with them.
IMPORT_ALL = """
import importlib, pkgutil, sys
import engine
names = [m.name for m in pkgutil.walk_packages(engine.__path__, "engine.")]
for name in names:
    if name != "engine.__main__":
        importlib.import_module(name)
qt = sorted(m for m in sys.modules if m.split(".")[0] in
            ("PySide6", "PyQt5", "PyQt6", "shiboken6"))
print(len(names), " ".join(qt))
"""


def test_the_engine_and_the_worker_run_without_qt():
    """The engine (and `python -m engine serve`) loads no Qt module: it runs where no GUI
    is installed, and a server never pays Qt's start-up."""
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, _, qt = done.stdout.strip().partition(" ")
    assert int(count) > 40  # every module was imported
    assert qt == "", f"importing the engine loaded {qt}"


# --- the engine's layout (engine/README.md) ------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The engine modules ``path`` imports, wherever the import stands (module level, inside
    a function, under TYPE_CHECKING): an import moved into a function still ties the two
    modules together."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _engine_graph() -> dict[str, set[str]]:
    files = sorted((ROOT / "engine").rglob("*.py"))
    known = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, known) for p in files}


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_inside_the_engine():
    graph = _engine_graph()
    assert len(graph) > 40
    assert _cycles(graph) == []


def test_the_engine_keeps_its_folders():
    """At most a dozen modules directly in engine/, none over 450 lines: each stage of a
    request is a package (model, text, runtime, kv, memory, generation, server)."""
    top = sorted(p.name for p in (ROOT / "engine").glob("*.py"))
    assert len(top) <= 12, top
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "engine").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert long == {}


def test_the_app_imports_only_the_engines_public_surface():
    """The app uses ``engine`` (the package root: engine/__init__.py), ``engine.api`` and
    ``engine.hub`` (downloads and the catalog, shared with the worker), nothing else; the
    rest it learns from the worker over HTTP."""
    public = {"engine", "engine.api", "engine.hub"}
    files = sorted((ROOT / "app").rglob("*.py"))
    known = _engine_graph().keys() | {"engine"}
    reached = {str(p.relative_to(ROOT)): sorted(_imports(p, set(known)) - public)
               for p in files}
    assert {f: m for f, m in reached.items() if m} == {}
