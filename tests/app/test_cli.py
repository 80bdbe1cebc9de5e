"""``python -m app --help`` as a user reads it."""

from __future__ import annotations

import json
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
