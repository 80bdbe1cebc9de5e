"""GUI tests: offscreen Qt, a real worker process on a forged model, a real AppContext.

- ``app_home``: ``ONNX_LOCAL_LLM_HOME`` pointed at a fresh temp folder per test (chats,
  settings and the admin token live there).
- ``models_root``: a folder with ``qwen-coder-tiny`` (FIM tokens, chat template) and
  ``slow-coder`` (~7 ms a token: long enough to watch streaming and to stop mid-answer).
- ``live_worker``: ``python -m engine serve`` as a subprocess (session-wide), serving
  ``slow-coder`` with ``models_root`` as its library; yields (url, admin_token).
- ``ctx``: an AppContext whose client talks to ``live_worker`` (no worker process of its
  own; tests of the worker lifecycle start their own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6.QtWidgets", reason="the GUI extra (PySide6) is not installed")
pytest.importorskip("pytestqt", reason="pytest-qt is not installed")

from app.context import AppContext
from app.paths import AppPaths
from tests.engine.server.live import SLOW_SPEC, write_model
from tests.forge import ForgeSpec
from tests.forge.tokenizer import SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parents[2]
TINY = "qwen-coder-tiny"
SLOW = "slow-coder"


def answers_of(max_tokens: int) -> Any:
    """The chat panel's sampling, greedy with the forge's special tokens barred (their ids
    are their places in its list): the forged model's random weights would otherwise end
    some answers (end of text, end of turn) or write nothing visible (the other specials)
    before a test can stop or kill them mid-answer."""
    return lambda: {"temperature": 0.0, "max_tokens": max_tokens,
                    "logit_bias": {str(i): -100 for i in range(len(SPECIAL_TOKENS))}}


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("app-models")
    write_model(root / TINY, ForgeSpec())
    write_model(root / SLOW, SLOW_SPEC)
    return root


def start_worker(model: Path | None, roots: list[Path], home: Path,
                 extra: list[str] | None = None) -> tuple[subprocess.Popen[bytes], dict]:
    """``python -m engine serve --port 0`` with its ready line read (raises on failure)."""
    args = [sys.executable, "-m", "engine", "serve", "--port", "0", "--threads", "1",
            "--admin-token-file", str(home / "admin-token"),
            "--kv-store-dir", str(home / "kv")]
    if model is not None:
        args += ["--model", str(model)]
    for root in roots:
        args += ["--models-dir", str(root)]
    proc = subprocess.Popen(args + (extra or []), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise RuntimeError(f"the worker did not start: {err[-2000:]}")
    ready = json.loads(line)
    ready["admin_token"] = (home / "admin-token").read_text(encoding="utf-8").strip()
    return proc, ready


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the worker's graceful stop), SIGKILL when it has not ended in 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def live_worker(models_root: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[str, str]]:
    home = tmp_path_factory.mktemp("worker-home")
    proc, ready = start_worker(models_root / SLOW, [models_root], home)
    yield ready["url"], ready["admin_token"]
    stop_worker(proc)


@pytest.fixture
def app_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("ONNX_LOCAL_LLM_HOME", str(home))
    return home


@pytest.fixture
def paths(app_home: Path) -> AppPaths:
    return AppPaths.default().ensure()


def connected(qtbot, paths: AppPaths, worker: tuple[str, str]) -> Iterator[AppContext]:
    """An AppContext talking to ``worker`` (url, admin token), its model known; shut down
    after the test. Fixtures yield from it."""
    context = AppContext(paths)
    url, token = worker
    context.client.configure(url, None, token)
    with qtbot.waitSignal(context.model_changed, timeout=10_000):
        context.refresh_model()
    yield context
    context.shutdown()


@pytest.fixture
def ctx(qtbot, paths: AppPaths, live_worker: tuple[str, str]) -> Iterator[AppContext]:
    yield from connected(qtbot, paths, live_worker)
