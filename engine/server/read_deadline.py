"""A deadline on reading each request: slow and idle clients cannot hold connections open.

uvicorn's HTTP/1.1 protocol has a keep-alive timer only between answers: a client that
opens a connection and sends nothing, or sends its headers or body a byte at a time, holds
the connection (and a file descriptor) for as long as it likes. Fifty such clients held a
worker's connections for 90 s and none was closed.

:class:`ReadDeadlineProtocol` gives each request ``read_timeout`` seconds, counted from
the connection's start (or from the end of the previous answer on a kept-alive
connection), to arrive whole, headers and body. A request still incomplete at the
deadline is answered ``408 Request Timeout`` and the connection closed; a connection that
sent nothing at all is closed without an answer. Once a request has arrived the deadline
is off: a long streamed answer is never cut by it.

The 408 is followed by a lingering close: the worker stops sending (a FIN after the
answer) and reads and drops what the client still sends for up to ``LINGER_S``, then
closes. Closing a socket outright while the client is still sending makes the kernel
answer its next bytes with a reset, and a reset can discard the 408 before the client
reads it (seen: "connection reset by peer" instead of the answer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("engine.server")

DEFAULT_READ_TIMEOUT_S = 30.0
#: Seconds a timed-out connection is drained after its 408 before it is closed.
LINGER_S = 2.0


def _timeout_answer(read_timeout: float) -> bytes:
    body = (f"the request did not arrive whole within {read_timeout:g} s "
            "(--read-timeout); send the headers and body without pauses\n").encode()
    head = ("HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    return head + body


class ReadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request (see the module)."""

    read_timeout: float = DEFAULT_READ_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_after: Any = None  # the cycle answered before the awaited request
        self._bytes_waiting = 0  # bytes received since the deadline was armed
        self._lingering = False  # answered 408: what arrives now is dropped

    # the deadline's life: armed at the connection's start and after each answer,
    # off once the awaited request (a new cycle) has all of its body
    def _arm(self, after: Any) -> None:
        self._disarm()
        self._waiting_after = after
        self._bytes_waiting = 0
        self._deadline = self.loop.call_later(self.read_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _check_arrived(self) -> None:
        cycle = self.cycle
        if (self._deadline is not None and cycle is not None
                and cycle is not self._waiting_after and not cycle.more_body):
            self._disarm()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(None)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        self._bytes_waiting += len(data)
        super().data_received(data)
        self._check_arrived()

    def on_response_complete(self) -> None:
        answered = self.cycle
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm(answered)
            self._check_arrived()  # a pipelined request may already be whole

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle if self.cycle is not self._waiting_after else None
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        if cycle is None and self._bytes_waiting == 0:
            log.debug("closed an idle connection from %s after %g s", client, self.read_timeout)
            self.transport.close()
            return
        log.info("closed a connection from %s: its request was not whole after %g s "
                 "(--read-timeout)", client, self.read_timeout)
        if cycle is not None:  # the app waits on the body: it reads a disconnect
            cycle.disconnected = True
            cycle.message_event.set()
        if cycle is not None and cycle.response_started:
            self.transport.close()
            return
        self.transport.write(_timeout_answer(self.read_timeout))
        self._linger()

    def _linger(self) -> None:
        """Half-close after the 408 and drop what still arrives, then close (see the
        module); the client's own close ends it sooner (``eof_received``)."""
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self._lingering = True
        self.transport.write_eof()
        self.transport.resume_reading()  # h11 may have paused it mid-request
        self.loop.call_later(LINGER_S, self.transport.close)


def read_deadline_protocol(read_timeout: float) -> type[ReadDeadlineProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for this timeout."""
    return type("ReadDeadlineProtocol", (ReadDeadlineProtocol,), {"read_timeout": read_timeout})
