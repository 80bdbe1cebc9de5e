"""``python -m app --help`` as a user reads it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.app.conftest import ROOT


def test_help_is_plain_text_that_names_every_option():
    done = subprocess.run([sys.executable, "-m", "app", "--help"], cwd=ROOT, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "``" not in text and not re.search(r":\w+:`", text)  # no reStructuredText
    for option in ("--model FOLDER", "--remote URL", "--no-welcome", "--selftest",
                   "--timeout SECONDS", "--worker ARGS"):
        assert option in text
    assert "(default 120)" in text


def test_worker_mode_runs_the_engines_command_line(genai_model_dir):
    """``app --worker ARGS`` is ``python -m engine ARGS`` (how the frozen app starts its
    worker): its output and exit codes come through."""
    done = subprocess.run([sys.executable, "-m", "app", "--worker", "inspect",
                           str(genai_model_dir), "--json"], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decode_path"] == "shared_buffer"
    bad = subprocess.run([sys.executable, "-m", "app", "--worker", "inspect",
                          str(genai_model_dir / "missing")], cwd=ROOT, text=True,
                         capture_output=True, timeout=120)
    assert bad.returncode != 0
    assert "missing" in bad.stderr


def test_the_selftest_report_says_whether_the_engines_kernel_runs(genai_model_dir, tmp_path):
    """``--selftest``'s JSON (what a bug report carries) has the worker's kernel report:
    here an install without the library, so ONNX Runtime's attention runs, and why."""
    env = {**os.environ, "ONNX_GENAI_KERNELS_LIBRARY": str(tmp_path / "absent.ortops")}
    done = subprocess.run([sys.executable, "-m", "app", "--selftest", "--model",
                           str(genai_model_dir)], cwd=ROOT, text=True, capture_output=True,
                          env=env, timeout=300)
    report = json.loads(done.stdout)
    kernels = report["engine_kernels"]
    assert kernels["state"] == "not built" and kernels["ready"] is False
    assert kernels["attention_nodes"] == 2 and kernels["moved"] == 0
    assert kernels["kept"] == {"the kernel is not built": 2}
    assert "re-run the install" in kernels["fix"]
