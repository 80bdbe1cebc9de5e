"""Who may call the worker: API key, admin token, browser origins, hosts, body size.

Pure ASGI middlewares (streaming responses pass through untouched):

- :class:`GuardMiddleware` — a request that carries an ``Origin`` header (only browsers
  send one) is refused unless that origin was allowed with ``--cors-origin``; on a loopback
  bind the ``Host`` header must name a loopback host (DNS rebinding); with ``--api-key``
  every route but ``/health`` needs ``Authorization: Bearer KEY``; admin routes always need
  the admin token. Without an API key, an empty ``Bearer`` is fine (llama.vim sends one).
- :class:`BodyLimitMiddleware` — bodies over the limit get 413, declared or streamed.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

import platformdirs
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.errors import EngineError
from engine.server.errors import ApiError, dialect_of, dumps, error_body

log = logging.getLogger(__name__)

APP_NAME = "onnx-local-llm"
ADMIN_PATHS = frozenset({"/v1/models/load", "/v1/models/unload", "/v1/library",
                         "/v1/library/roots", "/v1/limits", "/api/pull", "/v1/kv/free"})
PUBLIC_PATHS = frozenset({"/health"})
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


#: The API key from the environment (any local user can read a process's command line).
API_KEY_ENV = "ONNX_LOCAL_LLM_API_KEY"


def resolve_api_key(flag: str | None, key_file: Path | None,
                    environ: Mapping[str, str] = os.environ) -> str | None:
    """The API key: ``--api-key`` (warned about: argv is public), else ``--api-key-file``
    (its first line; refused when others may read it), else ``$ONNX_LOCAL_LLM_API_KEY``."""
    if flag:
        log.warning("--api-key is visible to every local user in the process list; pass "
                    "--api-key-file FILE (mode 0600) or set %s instead", API_KEY_ENV)
        return flag
    if key_file is not None:
        path = key_file.expanduser()
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
            if os.name == "posix" and mode & 0o077:
                raise EngineError(f"--api-key-file: {path} may be read by other users "
                                  f"(mode {mode:o})", hint=f"chmod 600 {path}")
            key = path.read_text(encoding="utf-8").strip().splitlines()
        except OSError as exc:
            raise EngineError(f"--api-key-file: cannot read {path}: {exc.strerror or exc}",
                              hint="give a file holding the key on its first line") from exc
        if not key or not key[0].strip():
            raise EngineError(f"--api-key-file: {path} is empty",
                              hint="write the key on its first line")
        return key[0].strip()
    return environ.get(API_KEY_ENV, "").strip() or None


def default_admin_token_file() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME)) / "admin-token"


def default_presets_file() -> Path:
    """The user's sampling presets, beside the admin token."""
    return Path(platformdirs.user_config_dir(APP_NAME)) / "presets.json"


def ensure_admin_token(path: Path | None) -> tuple[str, Path]:
    """Read the admin token from ``path`` (default: the user config dir), creating the file
    with a fresh token and mode 0600 when it does not exist."""
    path = (path or default_admin_token_file()).expanduser()
    if path.is_file():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("%s was readable by others (mode %o); setting it to 0600", path, mode)
            path.chmod(0o600)
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, path
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    path.chmod(0o600)
    return token, path


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def _bearer(scope: Scope) -> str | None:
    raw = _header(scope, b"authorization")
    if raw is not None:
        scheme, _, token = raw.strip().partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    return _header(scope, b"x-api-key")


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


async def send_error(send: Send, path: str, error: ApiError) -> None:
    body = dumps(error_body(error, dialect_of(path))).encode("utf-8")
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", str(error.retry_after_s).encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    def __init__(self, app: ASGIApp, *, api_key: str | None, admin_token: str,
                 cors_origins: Collection[str], loopback_only: bool) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_token = admin_token
        self.origins = frozenset(o.rstrip("/") for o in cors_origins)
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = self.check(scope)
        if error is not None:
            await send_error(send, scope["path"], error)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> ApiError | None:
        origin = _header(scope, b"origin")
        if origin is not None and origin.rstrip("/") not in self.origins:
            return ApiError(403, f"requests from the web origin {origin!r} are not allowed",
                            code="origin_not_allowed",
                            hint="start the worker with --cors-origin ORIGIN to allow it")
        if self.loopback_only:
            host = (_header(scope, b"host") or "").strip().lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host and name not in _LOOPBACK_HOSTS:
                return ApiError(403, f"the Host header {host!r} is not a loopback name",
                                code="host_not_allowed",
                                hint="call the worker as http://127.0.0.1:PORT")
        path = scope["path"]
        if scope["method"] == "OPTIONS" or path in PUBLIC_PATHS:
            return None
        token = _bearer(scope)
        if path in ADMIN_PATHS:
            if _same(token, self.admin_token):
                return None
            if token and self.api_key is not None and _same(token, self.api_key):
                return ApiError(403, "this route needs the admin token, not the API key",
                                code="admin_token_required",
                                hint="send Authorization: Bearer <contents of the admin "
                                "token file>")
            return ApiError(401, "this route needs the admin token", code="admin_token_required",
                            hint="send Authorization: Bearer <contents of the admin token file>")
        if self.api_key is None or _same(token, self.api_key) or _same(token, self.admin_token):
            return None
        message = "an API key is required" if not token else "the API key is not valid"
        return ApiError(401, message, code="invalid_api_key",
                        hint="send Authorization: Bearer <the key given with --api-key>")


class _BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive``; FastAPI passes HTTP exceptions through body parsing."""


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self, size: str) -> ApiError:
        return ApiError(413, f"the request body is {size}; the limit is {self.max_bytes} bytes",
                        code="body_too_large", hint="send less context, or start the worker "
                        "with a larger --max-body-bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, scope["path"], self._error(f"{declared} bytes"))
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge(413, self._error("larger than that").message)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await send_error(send, scope["path"], self._error("larger than that"))
