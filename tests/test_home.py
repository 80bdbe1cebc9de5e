"""The run's own home folder (tests/conftest.py, tests/home_guard.py): the user's folders are
never written, by the tests or by the worker processes they start, and a test is failed for
its own writes there only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import platformdirs
import pytest

from tests.home_guard import HomeGuard

ROOT = Path(__file__).resolve().parents[1]


def test_home_and_platformdirs_point_at_the_session_folder(session_home):
    assert Path(os.environ["HOME"]) == session_home
    assert Path(platformdirs.user_config_dir("onnx-local-llm")).is_relative_to(session_home)
    assert Path(platformdirs.user_cache_dir("onnx-local-llm")).is_relative_to(session_home)
    assert Path(platformdirs.user_data_dir("onnx-local-llm")).is_relative_to(session_home)


def test_a_worker_on_its_defaults_writes_into_the_session_home(session_home, genai_model_dir):
    """No --admin-token-file, no --kv-store-dir: the worker takes the user folders, which for
    a process a test starts are the test run's."""
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


def test_the_guard_watches_the_home_and_nothing_it_allows(tmp_path):
    home = tmp_path / "home"
    guard = HomeGuard(home, [home / "repo", tmp_path, "/"])  # tmp_path and / hold the home
    assert guard.writes_home(str(home / ".cache" / "x"))
    assert guard.writes_home(str(home))
    assert not guard.writes_home(str(home / "repo" / ".pytest_cache"))
    assert not guard.writes_home(str(home) + "-other")
    assert not guard.writes_home(str(tmp_path / "elsewhere"))
    assert not HomeGuard(Path("/"), []).writes_home("/dev/null")  # a container's HOME=/


#: A test file run by a second pytest with HOME at a stand-in for the user's real home (the
#: ``real`` folder below): each test's name says whether the guard must fail it.
GUARDED = """
import os, shutil, sqlite3, subprocess, sys, time
from pathlib import Path

REAL = Path(os.environ["STAND_IN_HOME"])
OWN = REAL / ".cache" / "onnx-local-llm"


def test_passes_while_another_program_writes_the_real_home():
    Path(os.environ["READY"]).touch()
    while not Path(os.environ["WRITTEN"]).exists():
        time.sleep(0.05)


def test_passes_reading_the_real_home():
    assert (OWN / "theirs").read_text() == "another program's"


def test_passes_writing_its_own_folders(tmp_path):
    (tmp_path / "a").write_text("x")
    (Path(os.environ["HOME"]) / ".cache" / "onnx-local-llm").mkdir(parents=True)


def test_fails_writing_a_file():
    (OWN / "mine").write_text("x")


def test_fails_making_a_folder():
    (REAL / ".config" / "onnx-local-llm").mkdir(parents=True)


def test_fails_moving_a_file_in(tmp_path):
    (tmp_path / "a").write_text("x")
    os.replace(tmp_path / "a", REAL / "moved")


def test_fails_opening_a_database():
    sqlite3.connect(REAL / "chats.db").close()


def test_fails_removing_a_file():
    (REAL / "gone").unlink()


def test_pip_leaves_the_user_rust_toolchain_alone(tmp_path):
    # pip runs `rustc --version` for its User-Agent whenever a rustc is on PATH
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-index", "--no-deps",
                           "-q", "-d", str(tmp_path), "no-such-package"], capture_output=True)
    assert b"No matching distribution" in done.stderr, done.stderr
    assert (Path(os.environ["RUSTUP_HOME"]) / "settings.toml").exists()  # the probe ran
"""

#: rustup's ``rustc`` as far as pip's probe sees it: it answers ``--version`` and, like
#: rustup's proxy on a fresh home, writes ``$RUSTUP_HOME/settings.toml`` (rustup is not
#: installed everywhere the tests run, and a real one would be the user's own).
RUSTC = """#!/bin/sh
home="${RUSTUP_HOME:-$HOME/.rustup}"
mkdir -p "$home" && echo 'profile = "default"' > "$home/settings.toml"
echo "rustc 1.80.0 (stand-in 2024-07-21)"
"""


@pytest.fixture(scope="module")
def guarded_run(tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Runs GUARDED under tests/conftest.py with HOME at a stand-in for the user's real home
    (``real``), the user's Rust homes in it (as a user may export them) and RUSTC first on
    PATH; writes the real home from this process while GUARDED's first test runs."""
    tmp_path = tmp_path_factory.mktemp("guarded")
    real = tmp_path / "real"
    (real / ".cache" / "onnx-local-llm").mkdir(parents=True)
    (real / ".cache" / "onnx-local-llm" / "theirs").write_text("another program's")
    (real / "gone").write_text("x")
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "rustc").write_text(RUSTC)
    (tmp_path / "bin" / "rustc").chmod(0o755)
    ready, written = tmp_path / "ready", tmp_path / "written"
    env = {**os.environ, "HOME": str(real), "STAND_IN_HOME": str(real),
           "RUSTUP_HOME": str(real / ".rustup"), "CARGO_HOME": str(real / ".cargo"),
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "READY": str(ready), "WRITTEN": str(written)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "tests.conftest",
                             "-p", "no:cacheprovider", "-q", "-rA", "--rootdir", str(tmp_path),
                             "--basetemp", str(tmp_path / "tmp"),
                             str(tmp_path / "test_guarded.py")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        while not ready.exists() and proc.poll() is None:
            time.sleep(0.05)
        # another program (a worker the user runs) writes the real home meanwhile
        (real / ".cache" / "onnx-local-llm" / "kv").mkdir()
        (real / ".cache" / "onnx-local-llm" / "kv" / "blob").write_text("x")
        written.touch()
        out, _ = proc.communicate()
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out), real


def _outcomes(output: str) -> dict[str, str]:
    """GUARDED's test name -> PASSED, FAILED or ERROR (the guard's failure comes at the
    test's teardown, after its PASSED), from pytest's -rA summary."""
    found: dict[str, str] = {}
    for match in re.finditer(r"^(PASSED|FAILED|ERROR) \S*test_guarded\.py::(\w+)", output,
                             re.MULTILINE):
        if found.get(match[2]) != "ERROR":
            found[match[2]] = match[1]
    return found


def test_the_guard_fails_a_test_for_its_own_writes_under_the_real_home(guarded_run):
    """Per test: another process writing the real home fails nothing; a test writing,
    making a folder, moving a file in, removing one or opening a database there fails,
    naming the path; reading there is fine."""
    done, real = guarded_run
    outcomes = _outcomes(done.stdout)
    assert outcomes == {
        "test_passes_while_another_program_writes_the_real_home": "PASSED",
        "test_passes_reading_the_real_home": "PASSED",
        "test_passes_writing_its_own_folders": "PASSED",
        "test_fails_writing_a_file": "ERROR", "test_fails_making_a_folder": "ERROR",
        "test_fails_moving_a_file_in": "ERROR", "test_fails_opening_a_database": "ERROR",
        "test_fails_removing_a_file": "ERROR",
        "test_pip_leaves_the_user_rust_toolchain_alone": "PASSED"}, done.stdout
    assert f"open {real}/.cache/onnx-local-llm/mine" in done.stdout
    assert f"os.rename {real}/moved" in done.stdout
    assert done.returncode == 1


def test_pip_in_a_test_leaves_the_user_rust_toolchain_alone(guarded_run, session_home):
    """pip (in a test that makes a venv or installs) runs ``rustc --version``, and rustup's
    rustc writes settings.toml into RUSTUP_HOME: the run points that into its own home even
    where the user exported theirs."""
    done, real = guarded_run
    assert _outcomes(done.stdout)["test_pip_leaves_the_user_rust_toolchain_alone"] == \
        "PASSED", done.stdout
    assert not (real / ".rustup").exists()
    assert not (real / ".cargo").exists()
    assert Path(os.environ["RUSTUP_HOME"]).is_relative_to(session_home)
    assert Path(os.environ["CARGO_HOME"]).is_relative_to(session_home)
