"""The HTTP client against a real worker: JSON calls, SSE streaming in pieces, failures."""

from __future__ import annotations

from app.client import ApiFailure, ChatOutcome, WorkerClient
from tests.app.conftest import answers_of


def test_model_card_names_the_served_model_and_its_folder(ctx):
    assert ctx.model is not None
    assert ctx.model["id"].endswith("slow-coder")
    assert ctx.model["meta"]["path"].endswith("slow-coder")


def test_chat_streams_in_pieces_and_reports_usage(qtbot, ctx):
    pieces: list[str] = []
    stream = ctx.client.chat([{"role": "user", "content": "hello"}],
                             {"max_tokens": 24, "temperature": 0})
    stream.delta.connect(pieces.append)
    with qtbot.waitSignal(stream.finished, timeout=30_000) as done:
        pass
    outcome: ChatOutcome = done.args[0]
    assert len(pieces) > 1
    assert "".join(pieces) == outcome.text
    assert outcome.usage is not None and outcome.usage["completion_tokens"] > 1
    assert outcome.finish_reason in {"length", "stop"}


def test_http_error_carries_the_workers_message_and_hint(qtbot, ctx):
    reply = ctx.client.call("PUT", "/v1/limits", {"host_ram": "1%", "vram": "1%"}, admin=True)
    with qtbot.waitSignal(reply.failed, timeout=10_000) as failed:
        pass
    failure: ApiFailure = failed.args[0]
    assert failure.status == 400
    assert "exactly one" in failure.message
    assert failure.hint


def test_unreachable_worker_is_status_zero_not_an_exception(qtbot):
    client = WorkerClient()
    client.configure("http://127.0.0.1:9")  # discard port: nothing listens
    reply = client.get("/health")
    with qtbot.waitSignal(reply.failed, timeout=10_000) as failed:
        pass
    assert failed.args[0].unreachable


def test_abort_stops_a_stream_without_further_signals(qtbot, ctx):
    stream = ctx.client.chat([{"role": "user", "content": "hi"}], answers_of(400)())
    seen: list[object] = []
    stream.finished.connect(seen.append)
    stream.failed.connect(seen.append)
    with qtbot.waitSignal(stream.delta, timeout=30_000):
        pass
    stream.abort()
    qtbot.wait(300)
    assert seen == []


def test_the_admin_token_goes_to_admin_routes_only(qtbot):
    """What a server sees (a plain HTTP server on loopback recording Authorization): the
    admin token on admin calls, the API key or nothing on the rest."""
    import http.server
    import threading

    seen: list[tuple[str, str | None]] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = WorkerClient()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for api_key in (None, "editor-key"):
            client.configure(url, api_key, "admin-secret")
            for path, admin in (("/v1/models", False), ("/v1/limits", True)):
                reply = client.get(path, admin=admin)
                with qtbot.waitSignal(reply.finished, timeout=10_000):
                    pass
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("/v1/models", None), ("/v1/limits", "Bearer admin-secret"),
                    ("/v1/models", "Bearer editor-key"), ("/v1/limits", "Bearer admin-secret")]
