"""A local engine sends nothing and writes nothing of ONNX Runtime's telemetry: every entry
point, run with a fresh HOME and no ORT_DISABLE_TELEMETRY of the user's, leaves no
~/.cache/Microsoft behind (plain onnxruntime does: the control)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


#: ONNX Runtime writes no telemetry when one of these says it runs under CI (seen: CI=true),
#: so they go too: a user's desktop has none of them, and without them the control proves
#: what the other tests claim.
_CI_MARKERS = {"CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS",
               "JENKINS_URL", "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION",
               "APPVEYOR", "BITBUCKET_BUILD_NUMBER"}


def _fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k != "ORT_DISABLE_TELEMETRY" and k not in _CI_MARKERS}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"),
               XDG_STATE_HOME=str(home / ".local/state"))
    return env


def _telemetry(home: Path) -> list[str]:
    found = home / ".cache" / "Microsoft"
    return sorted(str(p.relative_to(home)) for p in found.rglob("*")) if found.exists() else []


def test_the_check_sees_what_onnxruntime_writes(tmp_path: Path, genai_model_dir: Path):
    model = str(genai_model_dir / "model.onnx")
    code = (f"import onnxruntime as ort; ort.InferenceSession({model!r}, "
            "providers=['CPUExecutionProvider'])")
    subprocess.run([sys.executable, "-c", code], env=_fresh_env(tmp_path), check=True,
                   timeout=120, capture_output=True)
    assert _telemetry(tmp_path), "onnxruntime wrote nothing: the check below proves nothing"


@pytest.mark.parametrize("command", [
    ["generate", "--model", "{model}", "--prompt", "x", "--max-new-tokens", "2"],
    ["inspect", "{model}"]], ids=["generate", "inspect"])
def test_cli_commands_leave_no_telemetry(tmp_path: Path, genai_model_dir: Path, command):
    args = [a.format(model=genai_model_dir) for a in command]
    subprocess.run([sys.executable, "-m", "engine", *args], env=_fresh_env(tmp_path),
                   cwd=ROOT, check=True, timeout=120, capture_output=True)
    assert _telemetry(tmp_path) == []


def test_the_worker_leaves_no_telemetry(tmp_path: Path, genai_model_dir: Path):
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--port", "0",
                             "--threads", "1", "--model", str(genai_model_dir)],
                            env=_fresh_env(tmp_path), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        answer = httpx.post(f"{ready['url']}/v1/completions", timeout=60,
                            json={"prompt": "x", "max_tokens": 2})
        assert answer.status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert _telemetry(tmp_path) == []
    assert Path(ready["log_file"]).is_relative_to(tmp_path)  # its own log: the fresh home
