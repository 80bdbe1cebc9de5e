"""A real worker on 127.0.0.1 (uvicorn in a thread, port 0) and small HTTP helpers."""

from __future__ import annotations

import json
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from engine.config import EngineConfig
from engine.server.app import build_context, create_app
from engine.server.config import ServerConfig
from engine.server.serve import WorkerServer, bind, url_of, uvicorn_config
from engine.server.streaming import ServerContext
from tests.forge import ForgeSpec, write_genai_model

ADMIN = "admin-test-token"
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
MODEL_NAME = "qwen2.5-coder-1.5b"
#: ~7 ms per token on 2 cores: long enough to see streaming and cancellation happen.
SLOW_SPEC = ForgeSpec(context=1024, hidden=512, layers=8, intermediate=1536, heads=8,
                      kv_heads=2)


class LiveServer:
    """``python -m engine serve`` in-process: the same app, uvicorn, a real socket."""

    def __init__(self, config: ServerConfig) -> None:
        config = replace(config, port=0, admin_token=config.admin_token or ADMIN)
        self.config = config
        self.ctx: ServerContext = build_context(config)
        self.app = create_app(config, self.ctx)
        sock = bind("127.0.0.1", 0)
        self.url = url_of(sock)
        self.server = WorkerServer(uvicorn_config(self.app, config), None, self.ctx.stopping)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    def client(self, **headers: str) -> httpx.Client:
        # TCP_NODELAY as curl sets it: without it a request's body waits on a delayed ACK
        transport = httpx.HTTPTransport(socket_options=NODELAY)
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, transport=transport)

    def admin(self) -> httpx.Client:
        return self.client(Authorization=f"Bearer {self.config.admin_token}")

    def wait_idle(self, timeout: float = 60.0) -> float:
        """Seconds until the engine thread had nothing to do."""
        start = time.perf_counter()
        while not self.ctx.worker.idle:
            if time.perf_counter() - start > timeout:
                raise AssertionError("the engine thread stayed busy")
            time.sleep(0.001)
        return time.perf_counter() - start

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(30)


def serve(model: Path | None, models_dir: Path | None = None, **fields: Any) -> LiveServer:
    engine = fields.pop("engine", EngineConfig(intra_op_threads=1))
    config = ServerConfig(model=model, models_dirs=(models_dir,) if models_dir else (),
                          engine=engine, **fields)
    return LiveServer(config)


def write_model(folder: Path, spec: ForgeSpec = ForgeSpec()) -> Path:  # noqa: B008
    return write_genai_model(folder, spec)


def strip_fim(source: Path, folder: Path) -> Path:
    """A copy of a forged model whose vocabulary has no FIM tokens (same ids, renamed)."""
    shutil.copytree(source, folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = folder / name
        path.write_text(path.read_text(encoding="utf-8").replace("<|fim_", "<|nofim_"),
                        encoding="utf-8")
    return folder


def sse_events(lines: Iterable[str]) -> Iterator[Any]:
    """Parsed ``data:`` payloads of an SSE stream (``[DONE]`` kept as the string)."""
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)


LLAMA_VIM_ACCEPTS = (re.compile(r"^\s*{"), re.compile(r'"content"\s*:"'))


def llama_vim_accepts(raw: str) -> bool:
    """llama.vim's own test of an /infill answer."""
    return all(p.search(raw) for p in LLAMA_VIM_ACCEPTS)


def raw_request(url: str, method: str, path: str, body: bytes,
                headers: dict[str, str]) -> tuple[int, str]:
    """Send bytes exactly as given (httpx refuses header values like ``"Bearer "`` that curl,
    and so llama.vim, sends); return the status and the (de-chunked) body text."""
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", payload
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        payload = out
    return status, payload.decode("utf-8")
