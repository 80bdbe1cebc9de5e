"""Where the app keeps things: user data (chats), config, the bundled resources."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "onnx-local-llm"


def resources_dir() -> Path:
    """The shipped ``resources/`` (the built-in model, the icons) of the source tree, the
    wheel install or the frozen bundle: ``engine.model.default_model.resources_dir``."""
    from engine import resources_dir as shipped

    return shipped()


def engine_command(args: list[str]) -> tuple[str, list[str]]:
    """The program and arguments that run ``python -m engine ARGS`` in a child process: the
    same executable with ``--worker`` in the frozen app, the interpreter from source."""
    if getattr(sys, "frozen", False):
        return sys.executable, ["--worker", *args]
    return sys.executable, ["-m", "engine", *args]


@dataclass(frozen=True)
class AppPaths:
    data_dir: Path  # chats.sqlite3
    config_dir: Path  # settings, admin token
    cache_dir: Path  # downloads in progress, KV store

    @classmethod
    def default(cls) -> AppPaths:
        override = os.environ.get("ONNX_LOCAL_LLM_HOME")  # tests and portable installs
        if override:
            root = Path(override)
            return cls(root / "data", root / "config", root / "cache")
        return cls(Path(platformdirs.user_data_dir(APP_NAME)),
                   Path(platformdirs.user_config_dir(APP_NAME)),
                   Path(platformdirs.user_cache_dir(APP_NAME)))

    def ensure(self) -> AppPaths:
        for folder in (self.data_dir, self.config_dir, self.cache_dir):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def chats_db(self) -> Path:
        return self.data_dir / "chats.sqlite3"

    @property
    def models_dir(self) -> Path:
        """Where downloads go (a library root of its own)."""
        return self.data_dir / "models"

    @property
    def admin_token_file(self) -> Path:
        return self.config_dir / "admin-token"
