"""Rules of the code base that a test can hold by running the code."""

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
