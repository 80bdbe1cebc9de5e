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


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_lines(path: Path, known: set[str], root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) for each engine module ``path`` imports, wherever the import stands
    (module level, inside a function, under TYPE_CHECKING): an import moved into a
    function still ties the two modules together."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.append((node.lineno, f"{base}.{alias.name}"))
                elif base in known:
                    found.append((node.lineno, base))
    return sorted({(line, module) for line, module in found if module != name})


def _imports(path: Path, known: set[str]) -> set[str]:
    return {module for _, module in _import_lines(path, known)}


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


#: The engine's floors, bottom first (engine/README.md says why this order). A module may
#: import its own floor and the floors below it, never one above: the engine reads
#: bottom-up, and a change on one floor reaches only the floors above it. A module belongs
#: to the floor of the longest name here that it starts with.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("engine.errors",),
    ("engine.sizes", "engine.constraint"),
    ("engine.config",),
    ("engine.api",),
    ("engine.text",),
    ("engine.model",),
    ("engine.kernels",),
    ("engine.memory",),
    ("engine.runtime",),
    ("engine.generation",),
    ("engine.kv",),
    ("engine.scheduling",),
    ("engine.engine", "engine.loading"),
    ("engine.hub",),
    ("engine.server",),
    ("engine", "engine.__main__"),
)


def _floor(module: str, floors: tuple[tuple[str, ...], ...]) -> tuple[int, str]:
    """(floor number, the name that placed it) for an engine module."""
    best = max(((len(prefix), number, prefix) for number, names in enumerate(floors)
                for prefix in names if module == prefix or module.startswith(prefix + ".")),
               default=None)
    assert best is not None, f"{module} stands on no floor: add it to FLOORS"
    return best[1], best[2]


def _upward_imports(root: Path, floors: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every import in root/engine from a lower floor to a higher one, as
    "file:line imports module (floor n name -> floor m name)"."""
    files = sorted((root / "engine").rglob("*.py"))
    known = {_module_name(p, root) for p in files}
    found = []
    for path in files:
        here, here_name = _floor(_module_name(path, root), floors)
        for line, module in _import_lines(path, known, root):
            there, there_name = _floor(module, floors)
            if there > here:
                found.append(f"{path.relative_to(root).as_posix()}:{line} imports {module} "
                             f"(floor {here} {here_name} -> floor {there} {there_name})")
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


def test_engine_packages_import_only_downward():
    """The floors of FLOORS hold: no engine module imports one on a higher floor."""
    assert _upward_imports(ROOT, FLOORS) == []


def test_the_floor_check_finds_an_upward_import(tmp_path: Path):
    """The check itself, on a small tree: an import from text up to generation is named
    with its file and line, one downward is not, one inside a function counts too."""
    for name, text in {
        "engine/__init__.py": "",
        "engine/errors.py": "",
        "engine/text/__init__.py": "",
        "engine/text/fim.py": "from engine.errors import Error\n\n\ndef f():\n"
                              "    from engine.generation import stopping\n",
        "engine/generation/__init__.py": "",
        "engine/generation/stopping.py": "from engine.text.fim import f\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    floors = (("engine.errors",), ("engine.text",), ("engine.generation",), ("engine",))
    assert _upward_imports(tmp_path, floors) == [
        "engine/text/fim.py:5 imports engine.generation.stopping "
        "(floor 1 engine.text -> floor 2 engine.generation)"]


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
