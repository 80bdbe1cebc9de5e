"""The worker's log: one rotating file in the user log folder, plus stderr.

- The file (``worker.log`` in ``platformdirs.user_log_dir("onnx-local-llm")``, 2 MiB,
  three old files kept; ``--log-file PATH`` elsewhere, ``--no-log-file`` none) gets
  everything at INFO: the start-up facts, one line per request, warnings and errors.
- stderr gets the start-up facts, warnings and errors; with ``--access-log`` one line per
  request too (that flag's meaning is unchanged).
- Every request has an id: the client's ``X-Request-Id`` when it sends a usable one, else
  a new one; the answer carries it back in ``X-Request-Id`` and every line logged while
  the request runs names it (``[id]``), so an editor's report can be found in the file.

The ready line names the file (``log_file``) so the app can show it.
"""

from __future__ import annotations

import contextvars
import logging
import logging.handlers
import re
import time
import uuid
from email.utils import formatdate
from pathlib import Path

import platformdirs
from starlette.types import ASGIApp, Message, Receive, Scope, Send

APP_NAME = "onnx-local-llm"
MAX_BYTES = 2 * 1024 * 1024
BACKUPS = 3
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_USABLE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
#: Start-up facts go to stderr as well as the file.
startup_log = logging.getLogger("engine.server.startup")
access_log = logging.getLogger("engine.server.access")
_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def default_log_file() -> Path:
    return Path(platformdirs.user_log_dir(APP_NAME)) / "worker.log"


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class _StderrFilter(logging.Filter):
    def __init__(self, access: bool) -> None:
        super().__init__()
        self.access = access

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or record.name == startup_log.name:
            return True
        return self.access and record.name == access_log.name


def setup(log_file: Path | None, *, access: bool) -> Path | None:
    """Route the worker's logging to ``log_file`` (None: no file) and stderr; returns the
    file actually used (None when it could not be opened: stderr says why)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.INFO)
    for noisy in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # ours is engine.server.access
    ids = _RequestIdFilter()
    stderr = logging.StreamHandler()
    stderr.setFormatter(logging.Formatter("%(levelname)s [%(request_id)s] %(message)s"))
    stderr.addFilter(ids)
    stderr.addFilter(_StderrFilter(access))
    root.addHandler(stderr)
    if log_file is None:
        return None
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            log_file, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
    except OSError as exc:
        logging.getLogger(__name__).warning(
            "cannot write the worker log %s (%s); logging to stderr only "
            "(pass --log-file PATH in a folder you can write, or --no-log-file)",
            log_file, exc.strerror or exc)
        return None
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(ids)
    root.addHandler(handler)
    return log_file


class RequestIdMiddleware:
    """Gives each request its id, answers it in ``X-Request-Id`` and logs one line; adds
    the ``Date`` header (uvicorn's own is off: it refreshes it on a tick ten times a
    second, which keeps an idle worker waking up; engine/server/serve.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = next((v.decode("latin-1") for k, v in scope["headers"]
                     if k == b"x-request-id"), "")
        request_id = sent if _USABLE_ID.match(sent) else uuid.uuid4().hex[:12]
        token = REQUEST_ID.set(request_id)
        started = time.perf_counter()
        status = 500

        async def with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message = {**message, "headers": [
                    *message.get("headers", []), (b"x-request-id", request_id.encode()),
                    (b"date", formatdate(usegmt=True).encode())]}
            await send(message)

        try:
            await self.app(scope, receive, with_id)
        finally:
            client = scope.get("client")
            access_log.info("%s %s %s %d %.1f ms", client[0] if client else "-",
                            scope.get("method"), scope.get("path"), status,
                            (time.perf_counter() - started) * 1e3)
            REQUEST_ID.reset(token)
