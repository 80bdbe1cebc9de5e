"""Run a benchmark worker in a fresh process and read the JSON line it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_worker(module: str, *args: str, timeout: float = 1800,
               python: str | None = None) -> dict[str, Any]:
    """`python -m MODULE ARGS...` from the repository root; its last `{...}` stdout line.
    `python` is another interpreter (a peer's own venv); this one by default."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([python or sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{module} {' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
