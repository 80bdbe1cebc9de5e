"""The worker's log as the app starts the worker: a rotating file in the user log folder
(named by the ready line) with the start-up facts and one line per request under its id,
stderr with the start-up facts (and the requests only with --access-log)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx


def _start(*args: str, env: dict[str, str] | None = None
           ) -> tuple[subprocess.Popen[str], dict]:
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--port", "0",
                             "--threads", "1", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    return err


def test_the_log_file_has_start_up_facts_and_requests_by_id(model_dir: Path, tmp_path: Path):
    proc, ready = _start("--model", str(model_dir), "--admin-token-file",
                         str(tmp_path / "token"))
    try:
        log_file = Path(ready["log_file"])
        state = Path(os.environ["XDG_STATE_HOME"])  # the test run's temporary home
        assert log_file.name == "worker.log" and log_file.is_relative_to(state)
        with httpx.Client(base_url=ready["url"], timeout=60) as http:
            named = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                              headers={"X-Request-Id": "editor-42"})
            unnamed = http.get("/v1/models")
    finally:
        stderr = _stop(proc)
    assert named.headers["x-request-id"] == "editor-42"
    fresh = unnamed.headers["x-request-id"]
    assert fresh and fresh != "editor-42"
    for answer in (named, unnamed):  # one Date header (HTTP/1.1), the time of the answer
        dates = answer.headers.get_list("date")
        assert len(dates) == 1
        assert abs(parsedate_to_datetime(dates[0]).timestamp() - time.time()) < 3600
    text = log_file.read_text(encoding="utf-8")
    assert ready["model"] in text and "provider cpu" in text and "1 threads" in text
    assert "limits: queue" in text
    assert "kernels: the engine kernels are" in text
    assert any("[editor-42]" in line and "POST /v1/completions 200" in line
               for line in text.splitlines())
    assert any(f"[{fresh}]" in line and "GET /v1/models 200" in line
               for line in text.splitlines())
    # stderr: the start-up facts, not the requests (that is --access-log's job)
    assert "provider cpu" in stderr and "/v1/completions" not in stderr


def test_the_start_up_lines_say_the_kernel_is_not_built_and_what_runs(model_dir: Path,
                                                                       tmp_path: Path):
    """A worker on an install without the engine's kernel says so on stderr at start, with
    the fix, and how many attention nodes keep ONNX Runtime's kernel."""
    env = {**os.environ, "ONNX_GENAI_KERNELS_LIBRARY": str(tmp_path / "absent.ortops")}
    proc, _ = _start("--model", str(model_dir), "--admin-token-file", str(tmp_path / "token"),
                     "--no-log-file", env=env)
    stderr = _stop(proc)
    assert "attention: 0 of 2 GroupQueryAttention nodes run the engine kernel; ONNX " \
        "Runtime runs the other 2: the kernel is not built" in stderr
    assert "kernels: the engine kernels are not built: no absent.ortops " \
        f"in {tmp_path}" in stderr
    assert "re-run the install" in stderr


def test_access_log_and_no_log_file(model_dir: Path, tmp_path: Path):
    proc, ready = _start("--model", str(model_dir), "--admin-token-file",
                         str(tmp_path / "token"), "--access-log", "--no-log-file")
    try:
        with httpx.Client(base_url=ready["url"], timeout=60) as http:
            assert http.get("/v1/models").status_code == 200
    finally:
        stderr = _stop(proc)
    assert ready["log_file"] is None
    assert "GET /v1/models 200" in stderr


def test_an_unwritable_log_folder_falls_back_to_stderr(model_dir: Path, tmp_path: Path):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    proc, ready = _start("--model", str(model_dir), "--admin-token-file",
                         str(tmp_path / "token"), "--log-file", str(blocked / "worker.log"))
    stderr = _stop(proc)
    assert ready["log_file"] is None
    assert "cannot write the worker log" in stderr and "--log-file" in stderr


def _status(url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{url}/v1/models", headers=headers, timeout=60).status_code


def test_the_api_key_comes_from_a_private_file_or_the_environment(model_dir: Path,
                                                                  tmp_path: Path):
    """Not the command line: any local user can read a process's argv."""
    key_file = tmp_path / "key"
    key_file.write_text("file-secret\n")
    key_file.chmod(0o600)
    common = ["--model", str(model_dir), "--admin-token-file", str(tmp_path / "token")]
    proc, ready = _start(*common, "--api-key-file", str(key_file))
    try:
        assert _status(ready["url"], None) == 401
        assert _status(ready["url"], "file-secret") == 200
    finally:
        _stop(proc)
    proc, ready = _start(*common, env={**os.environ, "ONNX_LOCAL_LLM_API_KEY": "env-secret"})
    try:
        assert _status(ready["url"], "env-secret") == 200
        assert _status(ready["url"], "file-secret") == 401
    finally:
        _stop(proc)
    key_file.chmod(0o644)
    refused = subprocess.run([sys.executable, "-m", "engine", "serve", "--port", "0",
                              *common, "--api-key-file", str(key_file)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "may be read by other users" in refused.stderr and "chmod 600" in refused.stderr
