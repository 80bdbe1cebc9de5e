"""Live workers shared by the server tests (each built once per session)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine, EngineConfig
from tests.engine.server.live import (
    MODEL_NAME,
    SLOW_SPEC,
    LiveServer,
    serve,
    strip_fim,
    write_model,
)

# Servers keep prompt KV in the user cache dir: tests/conftest.py points it (with HOME and
# the other XDG folders) at the test run's own folder (session_home).


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``models/qwen2.5-coder-1.5b`` (Qwen FIM tokens, chat template) and
    ``models/plain-chat`` (the same model without FIM tokens)."""
    root = tmp_path_factory.mktemp("models")
    write_model(root / MODEL_NAME)
    strip_fim(root / MODEL_NAME, root / "plain-chat")
    return root


@pytest.fixture(scope="session")
def model_dir(models_root: Path) -> Path:
    return models_root / MODEL_NAME


@pytest.fixture(scope="session")
def engine(model_dir: Path) -> Engine:
    """The served model in-process, to check the server's answers token for token."""
    return Engine.load(model_dir, EngineConfig(intra_op_threads=1))


@pytest.fixture(scope="session")
def server(model_dir: Path, models_root: Path) -> Iterator[LiveServer]:
    live = serve(model_dir, models_root)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def slow_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bigger forged model (~7 ms a token on 2 cores), to watch streaming happen."""
    return write_model(tmp_path_factory.mktemp("slow") / "qwen-coder-slow", SLOW_SPEC)


@pytest.fixture(scope="session")
def slow_server(slow_model_dir: Path) -> Iterator[LiveServer]:
    live = serve(slow_model_dir)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def nofim_server(models_root: Path) -> Iterator[LiveServer]:
    live = serve(models_root / "plain-chat", models_root)
    yield live
    live.stop()
