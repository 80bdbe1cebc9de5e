"""The session's own home folder (tests/conftest.py): the user's folders are never written,
by the tests or by the worker processes they start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import platformdirs

from tests.conftest import home_changes, home_snapshot

ROOT = Path(__file__).resolve().parents[1]


def test_home_and_platformdirs_point_at_the_session_folder(session_home):
    assert Path(os.environ["HOME"]) == session_home
    assert Path(platformdirs.user_config_dir("onnx-local-llm")).is_relative_to(session_home)
    assert Path(platformdirs.user_cache_dir("onnx-local-llm")).is_relative_to(session_home)
    assert Path(platformdirs.user_data_dir("onnx-local-llm")).is_relative_to(session_home)


def test_a_worker_on_its_defaults_writes_into_the_session_home(session_home, genai_model_dir):
    """No --admin-token-file, no --kv-store-dir: the worker takes the user folders, which for
    a process a test starts are the session's."""
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--port", "0",
                             "--threads", "1", "--model", str(genai_model_dir)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        ready = json.loads(line)
        token = Path(ready["admin_token_file"])
        assert token.is_relative_to(session_home / ".config" / "onnx-local-llm"), token
        done = httpx.post(f"http://127.0.0.1:{ready['port']}/v1/completions", timeout=60,
                          json={"prompt": "def f(x):\n" * 20, "max_tokens": 2})
        assert done.status_code == 200, done.text
    finally:
        proc.terminate()
        proc.wait(30)
    kv = session_home / ".cache" / "onnx-local-llm" / "kv"
    assert any(p.is_file() for p in kv.rglob("*")), "the prompt's KV was not stored"
    assert not (session_home / ".cache" / "Microsoft").exists()  # ONNX Runtime's telemetry


def test_the_home_check_sees_a_new_changed_or_removed_file(tmp_path):
    (tmp_path / ".cache" / "onnx-local-llm").mkdir(parents=True)
    kept = tmp_path / ".cache" / "onnx-local-llm" / "kept"
    kept.write_text("a")
    before = home_snapshot(tmp_path)
    assert home_changes(before, home_snapshot(tmp_path)) == []
    (tmp_path / ".config" / "onnx-local-llm").mkdir(parents=True)
    (tmp_path / ".config" / "onnx-local-llm" / "admin-token").write_text("x")
    kept.write_text("longer")
    (tmp_path / ".local" / "share" / "onnx-local-llm").mkdir(parents=True)  # even empty
    assert set(home_changes(before, home_snapshot(tmp_path))) == {
        "~ .cache/onnx-local-llm/kept", "+ .config/onnx-local-llm",
        "+ .config/onnx-local-llm/admin-token", "+ .local/share/onnx-local-llm"}
    kept.unlink()
    assert "- .cache/onnx-local-llm/kept" in home_changes(before, home_snapshot(tmp_path))
