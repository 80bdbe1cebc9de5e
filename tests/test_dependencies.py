"""What pyproject.toml declares is what the code imports, per install flavour.

Every ``import`` under ``engine/`` and ``app/`` (read with ast, so imports inside functions
count too) is mapped to the distribution that provides it; the base install (the engine and
its worker) must declare every distribution ``engine/`` imports, the ``app`` extra what
``app/`` imports beyond that, each runtime extra one ONNX Runtime, and nothing declared for
run time may go unimported.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
OWN = {"engine", "app", "tests", "bench", "tools", "installer"}

#: Import names whose distribution may be absent from the environment the suite runs in
#: (a GPU extra's), so ``packages_distributions()`` cannot name it.
NOT_INSTALLED_HERE = {"pynvml": {"nvidia-ml-py"}}

#: The import that each runtime extra (cpu, cuda, directml) provides, under one name.
RUNTIME = "onnxruntime"
RUNTIME_VARIANTS = {"onnxruntime", "onnxruntime-gpu", "onnxruntime-directml"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _declared(requirements: list[str]) -> dict[str, Requirement]:
    parsed = (Requirement(r) for r in requirements)
    return {_norm(r.name): r for r in parsed}


def imported_modules(folder: str) -> dict[str, list[str]]:
    """Top-level names of the third-party modules imported under ``folder`` -> where."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in OWN or top == "__future__":
                    continue
                where = f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"
                found.setdefault(top, []).append(where)
    return found


def providers(module: str) -> set[str]:
    """The distributions (normalized names) that provide import name ``module``."""
    known = importlib.metadata.packages_distributions()
    dists = {_norm(d) for d in known.get(module, [])} | NOT_INSTALLED_HERE.get(module, set())
    assert dists, (f"no installed distribution provides {module!r}: install the extras, or "
                   f"name its distribution in NOT_INSTALLED_HERE")
    return dists


def missing(imports: dict[str, list[str]], declared: set[str]) -> list[str]:
    return [f"{module} ({', '.join(sorted(providers(module)))}) imported at {where[0]}"
            for module, where in sorted(imports.items())
            if module != RUNTIME and not providers(module) & declared]


def test_the_base_install_declares_what_the_engine_imports():
    """``pip install onnx-local-llm[cpu]`` (the engine and ``python -m engine serve``) has
    every module the engine imports; the GPU-only ones come with the cuda extra."""
    project = _project()
    extras = project["optional-dependencies"]
    base = set(_declared(project["dependencies"]))
    cuda = set(_declared(extras["cuda"]))
    imports = imported_modules("engine")
    gpu_only = {m: w for m, w in imports.items() if providers(m) <= cuda - base}
    assert set(gpu_only) == {"pynvml"}, gpu_only  # imported only when a GPU is in use
    problems = missing({m: w for m, w in imports.items() if m not in gpu_only}, base)
    assert not problems, problems


def test_the_app_extra_declares_what_the_app_imports():
    project = _project()
    declared = set(_declared(project["dependencies"]))
    declared |= set(_declared(project["optional-dependencies"]["app"]))
    problems = missing(imported_modules("app"), declared)
    assert not problems, problems


def test_each_runtime_extra_brings_exactly_one_onnxruntime():
    extras = _project()["optional-dependencies"]
    for name in ("cpu", "cuda", "directml"):
        variants = set(_declared(extras[name])) & RUNTIME_VARIANTS
        assert len(variants) == 1, f"[{name}] declares {variants or 'no ONNX Runtime'}"
    # no other install flavour the app or worker uses brings one beside them
    for name in ("app", "test", "dev"):
        assert not set(_declared(extras[name])) & RUNTIME_VARIANTS, name
    # the reference peer requires the CPU onnxruntime: never with a GPU variant
    assert not any(_norm(r.name) == "onnxruntime-genai"
                   for name, reqs in extras.items() if name != "peers"
                   for r in _declared(reqs).values()), "onnxruntime-genai outside [peers]"


def test_nothing_is_declared_for_run_time_that_the_code_does_not_import():
    project = _project()
    extras = project["optional-dependencies"]
    engine_dists = {d for m in imported_modules("engine") for d in providers(m)}
    app_dists = {d for m in imported_modules("app") for d in providers(m)}
    unused_base = set(_declared(project["dependencies"])) - engine_dists
    assert not unused_base, f"declared by the base install, imported by no engine module: " \
        f"{sorted(unused_base)} (tests and tools take theirs from the test extra)"
    unused_app = set(_declared(extras["app"])) - app_dists
    assert not unused_app, f"declared by [app], imported by no app module: {sorted(unused_app)}"
    runtime_extras = {d for name in ("cpu", "cuda") for d in _declared(extras[name])}
    unused_runtime = runtime_extras - engine_dists - RUNTIME_VARIANTS
    assert not unused_runtime, unused_runtime


@pytest.mark.parametrize(("dist", "floor", "why"), [
    ("huggingface-hub", Version("2.0"), "engine/hub/download.py uses the 2.x API and "
     "catches httpx2's errors, which huggingface_hub raises from 2.0 on"),
])
def test_declared_floors_admit_no_version_the_code_cannot_use(dist, floor, why):
    project = _project()
    every = {**_declared(project["dependencies"]),
             **_declared(project["optional-dependencies"]["app"])}
    allowed = every[dist].specifier
    below = Version(f"{floor.major - 1}.999")  # the newest release a major version below
    assert not allowed.contains(below), f"{dist}{allowed} admits {below}: {why}"


def test_the_app_without_qt_names_the_extra_that_brings_it():
    """A headless install (no [app] extra) has no PySide6: ``python -m app`` says which
    extra to install instead of a traceback."""
    no_qt = ("import sys; sys.modules['PySide6'] = None; from app.__main__ import main; "
             "sys.exit(main(sys.argv[1:]))")
    for args in ([], ["--selftest"]):
        done = subprocess.run([sys.executable, "-c", no_qt, *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1, (args, done.stderr)
        assert "pip install 'onnx-local-llm[cpu,app]'" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
