"""A `python -m engine serve` worker on loopback for the worker benchmarks.

``root`` is the checkout whose engine the worker runs (this one by default): pointing it at
another checkout (an older commit in a `git worktree`) measures that engine with the same
benchmark code.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    url: str
    host: str
    port: int

    def rss_mib(self) -> float:
        """The worker's resident set now (VmRSS), MiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS in /proc status")


@contextlib.contextmanager
def worker(*args: str, root: Path = REPO) -> Iterator[Worker]:
    """A worker on 127.0.0.1 (any free port), no log file, no KV store, HOME and XDG folders
    in a temporary folder; stopped after."""
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        err = open(Path(tmp) / "stderr.log", "w+", encoding="utf-8")  # noqa: SIM115
        cmd = [sys.executable, "-m", "engine", "serve", "--host", "127.0.0.1", "--port", "0",
               "--no-log-file", "--no-kv-store",
               "--admin-token-file", str(Path(tmp) / "admin-token"), *args]
        # its own config, cache and state folders: nothing lands in the user's
        env = {**os.environ, "PYTHONPATH": str(root), "HOME": tmp,
               **{f"XDG_{k}_HOME": str(Path(tmp) / k.lower())
                  for k in ("CONFIG", "CACHE", "STATE", "DATA")}}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=root,
                                env=env)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                proc.wait(30)
                err.seek(0)
                raise RuntimeError(f"the worker did not start:\n{err.read()[-3000:]}")
            ready = json.loads(line)
            yield Worker(proc, ready["url"], ready["host"], int(ready["port"]))
        finally:
            stop(proc)
            err.close()


def stop(proc: subprocess.Popen[Any]) -> None:
    """Ask a server process to end; kill it after 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
