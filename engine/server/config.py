"""What the worker is told at start: where it listens, who may call it, which models it sees."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import EngineConfig
from engine.errors import InvalidOptionError

DEFAULT_PORT = 8012  # llama.vim's and llama.vscode's default endpoint
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_QUEUE = 64


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one worker process (the `serve` command line, as a value)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: A model folder to load at start (trusted: the operator typed it).
    model: Path | None = None
    #: Folders whose model sub-folders may be listed and loaded through the API.
    models_dirs: tuple[Path, ...] = ()
    #: With a key, every route but /health needs `Authorization: Bearer KEY`.
    api_key: str | None = None
    #: The admin token (admin routes always need it); the caller reads or creates it.
    admin_token: str = ""
    admin_token_file: Path | None = None
    #: Browser origins allowed to call the server (CORS); none by default.
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Requests waiting for the engine beyond this many are refused with 429.
    max_queue: int = DEFAULT_MAX_QUEUE
    engine: EngineConfig = field(default_factory=EngineConfig)
    #: Seconds in-flight requests get to finish on SIGINT/SIGTERM before they are cancelled.
    graceful_shutdown_s: float = 5.0
    access_log: bool = False
    #: Chat sessions (X-Session-Id) close after this many seconds without a turn.
    session_idle_s: float = 1800.0
    #: The user's sampling presets per model (``engine.model.sampling_defaults``).
    presets: Path | None = None
    #: Named chat sessions kept at most (the least recently used idle one goes first).
    max_sessions: int = 64
    #: Seconds a request gets to arrive whole (headers and body); then 408 and close.
    read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidOptionError("port", f"expected 0..65535, got {self.port}",
                                     hint="use 0 to pick a free port")
        if self.max_body_bytes < 1024:
            raise InvalidOptionError("max_body_bytes", f"at least 1024, got {self.max_body_bytes}",
                                     hint="e.g. 8388608 (8 MiB)")
        if self.max_queue < 1:
            raise InvalidOptionError("max_queue", f"at least 1, got {self.max_queue}",
                                     hint="e.g. 64")
        if not self.session_idle_s > 0:
            raise InvalidOptionError("session_idle_s", f"expected seconds > 0, got "
                                     f"{self.session_idle_s}", hint="e.g. 1800 (30 minutes)")
        if not self.read_timeout_s > 0:
            raise InvalidOptionError("read_timeout", f"expected seconds > 0, got "
                                     f"{self.read_timeout_s}", hint="e.g. 30")
        if self.max_sessions < 1:
            raise InvalidOptionError("max_sessions", f"at least 1, got {self.max_sessions}",
                                     hint="e.g. 64")
        if self.api_key is not None and not self.api_key.strip():
            raise InvalidOptionError("api_key", "the key is empty",
                                     hint="leave --api-key out to run without one")
        for origin in self.cors_origins:
            if origin == "*" or not origin.startswith(("http://", "https://")):
                raise InvalidOptionError(
                    "cors_origin", f"expected an origin like http://localhost:3000, got {origin!r}",
                    hint="name each allowed origin; '*' is not accepted")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)
