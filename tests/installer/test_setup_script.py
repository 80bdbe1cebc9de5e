"""``./scripts/setup`` says what the engine loads for attention and 4-bit matmuls after
its pip install (the line of ``python -m engine.kernels``): its own kernel, or why not and the fix.

The script is sourced from a copy in a temporary folder, so only its functions are defined
(it installs nothing here), and its ``report_kernels`` runs with this checkout's engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import kernels

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup"


def _report(tmp_path: Path, *, tools: list[str] | None = None, **env: str) -> list[str]:
    """The script's kernel report; `tools`: PATH holds these only (fakes but `dirname`)."""
    copy = tmp_path / "clone" / "scripts" / "setup"
    copy.parent.mkdir(parents=True)
    shutil.copy2(SCRIPT, copy)
    if tools is not None:
        folder = tmp_path / "bin"
        folder.mkdir()
        (folder / "dirname").symlink_to(shutil.which("dirname") or "/usr/bin/dirname")
        for name in tools:
            (folder / name).write_text("#!/bin/sh\n", encoding="utf-8")
            (folder / name).chmod(0o755)
        env["PATH"] = str(folder)
    # errexit as the script sets it: a script that ran on when sourced would stop at its
    # first failure (its pip install in the copy's empty folder)
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", "-c",
         'source "$1"; report_kernels "$2"; echo "setup goes on"', "bash", str(copy),
         sys.executable],
        cwd=copy.parent, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "setup goes on"  # a kernel that is not ready stops nothing
    return lines[:-1]


@pytest.mark.skipif(kernels.library() is None, reason="the engine's kernel was not built here")
def test_a_built_kernel_is_reported_ready_not_missing(tmp_path):
    lines = _report(tmp_path)
    assert len(lines) == 1
    assert lines[0].startswith("setup: the engine kernels are ready (")
    assert "no C compiler" not in lines[0]


def test_a_missing_kernel_is_reported_with_the_compiler_on_path(tmp_path):
    lines = _report(tmp_path, tools=["gcc"],
                    ONNX_GENAI_KERNELS_LIBRARY=str(tmp_path / "absent.ortops"))
    assert len(lines) == 1
    assert lines[0].startswith("setup: the engine kernels are not built: "
                               f"no absent.ortops in {tmp_path}")
    assert f"a C compiler is on PATH now: {tmp_path / 'bin' / 'gcc'}" in lines[0]


def test_a_missing_kernel_without_a_compiler_says_to_install_one(tmp_path):
    lines = _report(tmp_path, tools=[],
                    ONNX_GENAI_KERNELS_LIBRARY=str(tmp_path / "absent.ortops"))
    assert len(lines) == 1 and "no C compiler on PATH" in lines[0]
    assert "sudo apt-get install gcc" in lines[0] and "./scripts/setup" in lines[0]


def test_a_kernel_turned_off_is_reported_off(tmp_path):
    lines = _report(tmp_path, ONNX_GENAI_KERNELS="0")
    assert lines == ["setup: the engine kernels are turned off: "
                     "ONNX_GENAI_KERNELS=0 in the environment; unset ONNX_GENAI_KERNELS to "
                     "turn it on"]
