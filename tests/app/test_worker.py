"""The worker process: started, read ready, watched; a crash is explained and repaired."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from app.worker import Crash, WorkerOptions, WorkerProcess, command_for, diagnose
from tests.app.conftest import ROOT, TINY


def test_worker_starts_reports_ready_and_stops_cleanly(qtbot, models_root, app_home):
    worker = WorkerProcess()
    states: list[str] = []
    worker.state_changed.connect(states.append)
    with qtbot.waitSignal(worker.ready, timeout=30_000) as ready:
        worker.start(WorkerOptions(model=str(models_root / TINY),
                                   admin_token_file=str(app_home / "token")))
    info = ready.args[0]
    assert info.url.startswith("http://127.0.0.1:")
    assert info.model == TINY
    assert info.admin_token and len(info.admin_token) > 16
    pid = info.pid
    worker.stop()
    assert states == ["starting", "ready", "stopped"]
    with qtbot.waitSignal(worker.died, timeout=500, raising=False) as died:
        pass
    assert not died.signal_triggered  # a requested stop is not a crash
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive


def test_killed_worker_is_explained_and_comes_back_with_its_model(qtbot, models_root,
                                                                   app_home):
    worker = WorkerProcess()
    with qtbot.waitSignal(worker.ready, timeout=30_000):
        worker.start(WorkerOptions(model=str(models_root / TINY),
                                   admin_token_file=str(app_home / "token")))
    first = worker.pid
    assert first is not None
    with qtbot.waitSignal(worker.died, timeout=60_000) as died:
        os.kill(first, signal.SIGKILL)
    crash = died.args[0]
    assert crash.exit_code == -9
    assert "killed" in crash.diagnosis
    assert crash.restarting
    with qtbot.waitSignal(worker.ready, timeout=60_000) as ready:  # speed: bench.latency
        pass
    assert ready.args[0].pid != first
    assert ready.args[0].model == TINY  # the model came back with it
    worker.stop()


def test_a_worker_that_cannot_start_says_why_and_gives_up(qtbot, tmp_path, app_home):
    worker = WorkerProcess()
    crashes: list[Crash] = []
    worker.died.connect(crashes.append)
    worker.start(WorkerOptions(model=str(tmp_path / "no-such-model"),
                               admin_token_file=str(app_home / "token")))
    qtbot.waitUntil(lambda: worker.state == "failed", timeout=60_000)
    assert len(crashes) > 1  # restarted a few times first
    diagnosis = crashes[-1].diagnosis  # the engine's own error and fix, as it printed them
    assert f"error: model folder {tmp_path / 'no-such-model'} does not exist" in diagnosis
    assert "fix: pass the folder that holds model.onnx" in diagnosis
    assert not crashes[-1].restarting


def test_diagnosis_words():
    assert "out of memory" in diagnose(1, False, ["MemoryError"]).lower()
    assert "gpu runtime" in diagnose(1, False, [
        "libcudart.so.12: cannot open shared object file"]).lower()
    assert "port" in diagnose(2, False, ["error: cannot listen on 127.0.0.1:80: Address "
                                         "already in use"]).lower()


def test_worker_command_is_python_m_engine_from_source():
    program, args = command_for(WorkerOptions(model="/m", port=0))
    assert program == sys.executable
    assert args[:3] == ["-m", "engine", "serve"]
    assert args[args.index("--model") + 1] == "/m"


def launch_app(home: Path, model: Path) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """``python -m app`` as a user starts it, once its model answers; and its worker."""
    env = {**os.environ, "ONNX_LOCAL_LLM_HOME": str(home), "ONNX_LOCAL_LLM_TIMING": "1",
           "QT_QPA_PLATFORM": "offscreen"}
    app = subprocess.Popen([sys.executable, "-m", "app", "--no-welcome", "--model",
                            str(model)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    assert app.stderr is not None
    for line in app.stderr:
        if line.startswith("{") and json.loads(line)["event"] == "model_ready":
            break
    workers = [p for p in psutil.Process(app.pid).children()
               if "engine" in " ".join(p.cmdline())]
    return app, workers


def test_the_worker_never_outlives_the_app(tmp_path, models_root):
    """However the app ends (here: SIGKILL, which runs no clean-up), its worker stops."""
    app, workers = launch_app(tmp_path / "home", models_root / TINY)
    assert len(workers) == 1
    app.kill()
    app.wait(60)
    _gone, alive = psutil.wait_procs(workers, timeout=60)
    assert alive == [], "the worker outlived the app"


def test_sigterm_closes_the_app_and_its_worker(tmp_path, models_root):
    app, workers = launch_app(tmp_path / "home", models_root / TINY)
    app.terminate()
    assert app.wait(60) == 0
    _gone, alive = psutil.wait_procs(workers, timeout=60)
    assert alive == []
    settings = (tmp_path / "home" / "config" / "settings.ini").read_text()
    assert "geometry" in settings  # the window's state was saved on the way out


def test_the_api_key_reaches_the_worker_through_its_environment_not_argv(
        qtbot, models_root, app_home, monkeypatch):
    """Every local user can read a process's command line: the key is not on it, yet the
    worker asks for it; a key in the user's own environment does not leak into a worker
    the app starts without one."""
    import httpx

    monkeypatch.setenv("ONNX_LOCAL_LLM_API_KEY", "from-the-users-shell")
    worker = WorkerProcess()
    with qtbot.waitSignal(worker.ready, timeout=60_000) as ready:
        worker.start(WorkerOptions(model=str(models_root / TINY), api_key="s3cret-key",
                                   admin_token_file=str(app_home / "token")))
    try:
        info = ready.args[0]
        cmdline = " ".join(psutil.Process(info.pid).cmdline())
        assert "s3cret-key" not in cmdline and "--api-key" not in cmdline
        assert httpx.get(f"{info.url}/v1/models", timeout=30).status_code == 401
        keyed = httpx.get(f"{info.url}/v1/models", timeout=30,
                          headers={"Authorization": "Bearer s3cret-key"})
        assert keyed.status_code == 200
        assert info.log_file and Path(info.log_file).is_file()
    finally:
        worker.stop()
    open_worker = WorkerProcess()
    with qtbot.waitSignal(open_worker.ready, timeout=60_000) as ready:
        open_worker.start(WorkerOptions(model=str(models_root / TINY),
                                        admin_token_file=str(app_home / "token")))
    try:
        assert httpx.get(f"{ready.args[0].url}/v1/models", timeout=30).status_code == 200
    finally:
        open_worker.stop()
