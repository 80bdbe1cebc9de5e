"""DESIGN.md's rules that a test can hold."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_engine_imports_no_qt():
    offenders = []
    for path in (ROOT / "engine").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names
                          if n.split(".")[0] in ("PySide6", "PyQt5", "PyQt6", "shiboken6")]
    assert offenders == []
