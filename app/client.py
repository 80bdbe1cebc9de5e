"""HTTP to the worker on Qt's own network stack: JSON calls and server-sent events.

Everything is asynchronous and signal-based (``QNetworkAccessManager`` on the main thread);
nothing here blocks the GUI. The worker is either the local one the app started or a
remote OpenAI-compatible server (Settings).

- :meth:`WorkerClient.call` → :class:`JsonReply`: ``finished(dict)`` on 2xx, else
  ``failed(ApiFailure)``.
- :meth:`WorkerClient.stream` → :class:`SseStream`: ``message(dict)`` per ``data:`` line as
  it arrives (read on ``readyRead``), ``finished()`` at ``[DONE]`` or a clean end,
  ``failed(ApiFailure)``.
- :meth:`WorkerClient.chat` → :class:`ChatStream`: OpenAI chat deltas as text pieces.

Status 0 in an :class:`ApiFailure` means the worker could not be reached (refused, reset,
timed out): the caller shows "the worker is not running", not an HTTP error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QByteArray, QObject, QTimer, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

from app.memory_words import gui_words
from app.sse import SseEvent, SseParser

_STATUS = QNetworkRequest.Attribute.HttpStatusCodeAttribute


def server_root(url: str) -> str:
    """The server's root from a URL as users copy it: OpenAI's client, vLLM, LM Studio and
    Ollama document ``http://host:port/v1``, while this client adds ``/v1/...`` (and the
    llama.cpp and Ollama routes at the root) itself. A final ``/v1`` segment and trailing
    slashes are dropped; any other path (a proxy's prefix) is kept."""
    root = url.strip().rstrip("/")
    if root.lower().endswith("/v1"):
        root = root[:-3].rstrip("/")
    return root


@dataclass(frozen=True)
class ApiFailure:
    """A failed call, in words a user can act on."""

    status: int  # 0: no HTTP answer (worker down, refused, reset, timed out, aborted)
    message: str
    hint: str | None = None
    code: str | None = None
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def unreachable(self) -> bool:
        return self.status == 0

    def text(self) -> str:
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


def failure_from(status: int, raw: bytes, network_error: str = "") -> ApiFailure:
    """An ApiFailure from an error body of any of the worker's dialects (or none)."""
    if status == 0:
        return ApiFailure(0, f"the worker did not answer ({network_error or 'no connection'})",
                          hint="it may be starting or restarting; the status bar shows its "
                          "state", code="unreachable")
    try:
        body = json.loads(raw.decode("utf-8")) if raw else {}
    except (UnicodeDecodeError, ValueError):
        body = {}
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        message, hint = str(err.get("message") or f"HTTP {status}"), err.get("hint")
        if hint is None and message.endswith(")") and " (fix: " in message:
            message, _, hint = message[:-1].rpartition(" (fix: ")  # the worker's own form
        message, hint = gui_words(message), hint and gui_words(str(hint))
        return ApiFailure(status, message, hint=hint,
                          code=err.get("code") and str(err.get("code")), body=body)
    if isinstance(err, str):
        return ApiFailure(status, gui_words(err), body=body)
    text = raw.decode("utf-8", "replace").strip()[:300]
    return ApiFailure(status, text or f"HTTP {status}", body=body if isinstance(body, dict)
                      else {})


class _ReplyBase(QObject):
    failed = Signal(object)  # ApiFailure

    def __init__(self, reply: QNetworkReply, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._reply = reply
        self._done = False
        self._aborted = False
        reply.finished.connect(self._on_finished)

    @property
    def done(self) -> bool:
        return self._done

    def abort(self) -> None:
        """Stop the request; no further signal is emitted."""
        if not self._done:
            self._aborted = True
            self._done = True
            self._reply.abort()

    def _status(self) -> int:
        value = self._reply.attribute(_STATUS)
        return int(value) if value is not None else 0

    def _fail_if_error(self, raw: bytes) -> bool:
        status = self._status()
        if status == 0 or status >= 400:
            self._done = True
            self.failed.emit(failure_from(status, raw, self._reply.errorString()))
            return True
        return False

    def _on_finished(self) -> None:
        raise NotImplementedError


class JsonReply(_ReplyBase):
    """One JSON request; ``finished(dict)`` on success."""

    finished = Signal(object)

    def _on_finished(self) -> None:
        self._reply.deleteLater()
        if self._aborted:
            return
        raw = bytes(self._reply.readAll().data())
        if self._fail_if_error(raw):
            return
        self._done = True
        try:
            body = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError):
            self.failed.emit(ApiFailure(self._status(), "the worker sent something that is not "
                                        "JSON", code="bad_response"))
            return
        self.finished.emit(body)


class SseStream(_ReplyBase):
    """Server-sent events: one ``message(dict)`` per ``data:`` line, as bytes arrive."""

    message = Signal(object)
    finished = Signal()

    def __init__(self, reply: QNetworkReply, parent: QObject | None = None) -> None:
        super().__init__(reply, parent)
        self._buffer = b""
        self._error_body = b""
        self._parser = SseParser()
        self.events = 0  # events read (a stream that ends with none sent nothing readable)
        reply.readyRead.connect(self._on_ready_read)

    def _on_ready_read(self) -> None:
        if self._aborted or self._done:
            return
        chunk = bytes(self._reply.readAll().data())
        status = self._status()
        if status >= 400:
            self._error_body += chunk
            return
        for event in self._parser.feed(chunk):
            self._dispatch(event)
            if self._done:
                return

    def _dispatch(self, event: SseEvent) -> None:
        self.events += 1
        data = event.data
        if data.strip() == "[DONE]":
            self._done = True
            self.finished.emit()
            return
        try:
            payload = json.loads(data)
        except ValueError:
            payload = None
        if event.event == "error" or (isinstance(payload, dict)
                                      and isinstance(payload.get("error"), (dict, str))):
            self._done = True
            self.failed.emit(failure_from(500, data.encode("utf-8")))
            return
        if payload is not None:  # a line we cannot read is skipped, not fatal
            self.message.emit(payload)

    def _on_finished(self) -> None:
        self._reply.deleteLater()
        if self._aborted or self._done:
            return
        self._on_ready_read()
        if self._done:
            return
        if self._fail_if_error(self._error_body):
            return
        if self._reply.error() != QNetworkReply.NetworkError.NoError:
            self._done = True
            self.failed.emit(failure_from(0, b"", self._reply.errorString()))
            return
        self._done = True
        self.finished.emit()


class NdjsonStream(SseStream):
    """Newline-delimited JSON (Ollama's streams): one ``message(dict)`` per line,
    ``finished()`` after a line with ``"done": true`` or a clean end; a line with an
    ``error`` is ``failed``."""

    def _on_ready_read(self) -> None:
        if self._aborted or self._done:
            return
        chunk = bytes(self._reply.readAll().data())
        if self._status() >= 400:
            self._error_body += chunk
            return
        self._buffer += chunk
        if self._reply.isFinished() and self._buffer and not self._buffer.endswith(b"\n"):
            self._buffer += b"\n"
        while b"\n" in self._buffer and not self._done:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._dispatch_line(line)

    def _dispatch_line(self, line: bytes) -> None:
        try:
            payload = json.loads(line.decode("utf-8")) if line.strip() else None
        except (UnicodeDecodeError, ValueError):
            return  # a line we cannot read is skipped, not fatal
        if not isinstance(payload, dict):
            return
        if payload.get("error"):
            self._done = True
            self.failed.emit(failure_from(500, line))
            return
        self.message.emit(payload)
        if payload.get("done") is True:
            self._done = True
            self.finished.emit()


@dataclass(frozen=True)
class ChatOutcome:
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


class ChatStream(QObject):
    """An OpenAI chat completion, streamed: ``delta(str)`` pieces, then ``finished``;
    a reasoning model's thoughts (``delta.reasoning_content``) come as ``thought(str)``."""

    delta = Signal(str)
    thought = Signal(str)
    finished = Signal(object)  # ChatOutcome
    failed = Signal(object)  # ApiFailure (with the text so far in .body["partial"])

    def __init__(self, stream: SseStream, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._stream = stream
        self._parts: list[str] = []
        self._thoughts: list[str] = []
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._events = 0
        stream.message.connect(self._on_event)
        stream.finished.connect(self._on_finished)
        stream.failed.connect(self._on_failed)

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def thoughts(self) -> str:
        return "".join(self._thoughts)

    def abort(self) -> None:
        self._stream.abort()

    def _on_event(self, payload: Any) -> None:
        if not isinstance(payload, dict):
            return
        self._events += 1
        if isinstance(payload.get("usage"), dict):
            self._usage = payload["usage"]
        for choice in payload.get("choices") or ():
            thought = (choice.get("delta") or {}).get("reasoning_content")
            if thought:
                self._thoughts.append(thought)
                self.thought.emit(thought)
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                self._parts.append(piece)
                self.delta.emit(piece)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]

    def _on_finished(self) -> None:
        if not self._events:
            self.failed.emit(ApiFailure(200, "the server ended the answer without sending "
                                        "any of it (no event could be read from its stream)",
                                        code="bad_response", body={"partial": ""}))
            return
        self.finished.emit(ChatOutcome(self.text, self._finish, self._usage))

    def _on_failed(self, failure: ApiFailure) -> None:
        body = {**failure.body, "partial": self.text}
        self.failed.emit(ApiFailure(failure.status, failure.message, failure.hint,
                                    failure.code, body))


class WorkerClient(QObject):
    """The one HTTP client of the app; ``configure`` points it at a worker."""

    configured = Signal(str)  # base URL

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._nam = QNetworkAccessManager(self)
        self._nam.setAutoDeleteReplies(False)
        self.base_url = ""
        self.api_key: str | None = None
        self.admin_token: str | None = None

    def configure(self, base_url: str, api_key: str | None = None,
                  admin_token: str | None = None) -> None:
        self.base_url = server_root(base_url)
        self.api_key = api_key or None
        self.admin_token = admin_token or None
        self.configured.emit(self.base_url)

    @property
    def is_configured(self) -> bool:
        return bool(self.base_url)

    def _request(self, path: str, admin: bool, headers: dict[str, str] | None,
                 timeout_ms: int) -> QNetworkRequest:
        request = QNetworkRequest(QUrl(self.base_url + path))
        request.setHeader(QNetworkRequest.KnownHeaders.ContentTypeHeader, "application/json")
        # the admin token goes to admin routes only; the API key (if any) to the rest
        token = self.admin_token if admin else self.api_key
        if token:
            request.setRawHeader(b"Authorization", f"Bearer {token}".encode())
        for key, value in (headers or {}).items():
            request.setRawHeader(key.encode(), value.encode())
        if timeout_ms:
            request.setTransferTimeout(timeout_ms)
        return request

    def _send(self, method: str, request: QNetworkRequest, body: Any) -> QNetworkReply:
        data = QByteArray(json.dumps(body).encode("utf-8")) if body is not None else QByteArray()
        return self._nam.sendCustomRequest(request, method.encode(), data)

    def call(self, method: str, path: str, body: Any = None, *, admin: bool = False,
             headers: dict[str, str] | None = None, timeout_ms: int = 60_000) -> JsonReply:
        """One JSON request (``GET``, ``POST``, ``PUT``, ``DELETE``)."""
        request = self._request(path, admin, headers, timeout_ms)
        return JsonReply(self._send(method, request, body), self)

    def get(self, path: str, *, admin: bool = False, timeout_ms: int = 10_000) -> JsonReply:
        return self.call("GET", path, admin=admin, timeout_ms=timeout_ms)

    def stream(self, method: str, path: str, body: Any = None, *, admin: bool = False,
               headers: dict[str, str] | None = None) -> SseStream:
        """A server-sent-event stream (no transfer timeout: answers can be long)."""
        request = self._request(path, admin, {"Accept": "text/event-stream", **(headers or {})},
                                0)
        return SseStream(self._send(method, request, body), self)

    def lines(self, method: str, path: str, body: Any = None, *,
              headers: dict[str, str] | None = None) -> NdjsonStream:
        """A newline-delimited JSON stream (Ollama's dialect)."""
        request = self._request(path, False, headers, 0)
        return NdjsonStream(self._send(method, request, body), self)

    def chat(self, messages: list[dict[str, str]], options: dict[str, Any] | None = None, *,
             session_id: str | None = None, model: str = "") -> ChatStream:
        """``POST /v1/chat/completions`` streamed; ``session_id`` keeps the conversation's
        KV in the worker between turns (``X-Session-Id``)."""
        body = {"model": model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **(options or {})}
        headers = {"X-Session-Id": session_id} if session_id else None
        return ChatStream(self.stream("POST", "/v1/chat/completions", body, headers=headers),
                          self)


def single_shot(delay_ms: int, parent: QObject) -> QTimer:
    """A one-shot timer owned by ``parent`` (debounces, retry delays)."""
    timer = QTimer(parent)
    timer.setSingleShot(True)
    timer.setInterval(delay_ms)
    return timer
