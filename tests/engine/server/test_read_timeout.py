"""Slow and idle clients cannot hold the worker's connections: a request must arrive whole
(headers and body) within ``--read-timeout``; after it the answer, however long it streams,
is not limited. The timeout here is 1 s; the waits for the server's close are generous
(``GIVE_UP``) and nothing asserts on wall-clock time: `python -m bench.slow_clients`
measures when the connections close."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.server.live import LiveServer, serve, sse_events

READ_TIMEOUT = 1.0
GIVE_UP = 60.0  # seconds a test waits for the server to close a connection


@pytest.fixture(scope="module")
def strict_server(slow_model_dir: Path) -> Iterator[LiveServer]:
    live = serve(slow_model_dir, read_timeout_s=READ_TIMEOUT)
    yield live
    live.stop()


def connect(server: LiveServer) -> socket.socket:
    host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=GIVE_UP)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends before it closes (socket.timeout if it never does)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def trickle(sock: socket.socket, data: bytes, stop: threading.Event) -> threading.Thread:
    """Send ``data`` a byte every 50 ms until it is all sent, ``stop`` is set, or the
    server closes: a slow-loris client."""
    def run() -> None:
        for i in range(len(data)):
            if stop.wait(0.05):
                return
            try:
                sock.send(data[i:i + 1])
            except OSError:
                return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_trickled_headers_are_answered_408_and_closed(strict_server: LiveServer):
    sock = connect(strict_server)
    stop = threading.Event()
    headers = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"X-Pad: a\r\n" * 400 + b"\r\n"
    thread = trickle(sock, headers, stop)  # ~20 s of headers, a byte at a time
    try:
        answer = read_until_closed(sock)
    finally:
        stop.set()
        thread.join()
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"--read-timeout" in answer


def test_the_408_reaches_a_client_that_goes_on_sending(strict_server: LiveServer):
    # A slow client is still sending when the deadline passes: the worker answers 408 and
    # drains what follows before closing; closed outright, the client's next bytes would
    # be answered with a reset that can discard the 408 unread.
    sock = connect(strict_server)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        time.sleep(1.5 * READ_TIMEOUT)  # answered meanwhile (LINGER_S ago at most); unread
        for _ in range(5):
            sock.sendall(b"X-Pad: a\r\n")
            time.sleep(0.05)
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]


def test_a_body_that_never_completes_is_answered_408_and_closed(strict_server: LiveServer):
    sock = connect(strict_server)
    body = b'{"prompt": "def f(x):", "n_predict": 4}'
    sock.sendall(b"POST /completion HTTP/1.1\r\nHost: localhost\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(body) + 100}\r\n\r\n".encode() + body)
    try:
        answer = read_until_closed(sock)  # the last 100 bytes never come
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]


def test_a_connection_that_sends_nothing_is_closed(strict_server: LiveServer):
    sock = connect(strict_server)
    try:
        assert read_until_closed(sock) == b""  # closed, no answer to a request never made
    finally:
        sock.close()


def test_a_stream_outlives_the_read_timeout(strict_server: LiveServer):
    """The client reads slowly, so the stream lasts several read timeouts; it is whole,
    and the kept-alive connection then serves the next request."""
    strict_server.wait_idle()
    events: list = []
    with strict_server.client() as http:
        with http.stream("POST", "/completion", json={
                "prompt": "def g(y):\n", "stream": True, "n_predict": 40, "temperature": 0,
                "samplers": ["temperature"], "ignore_eos": True}) as response:
            assert response.status_code == 200
            for event in sse_events(response.iter_lines()):
                events.append(event)
                if len(events) in (1, 20):
                    time.sleep(2 * READ_TIMEOUT)  # past the timeout, twice
        final = events[-1]
        assert final["stop"] is True and final["timings"]["predicted_n"] == 40
        again = http.post("/completion", json={"prompt": "x", "n_predict": 2})
        assert again.status_code == 200 and again.json()["stop"] is True
