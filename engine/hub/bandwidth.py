"""Memory read bandwidth of this machine, measured once and kept in the engine's cache
folder (``platformdirs.user_cache_dir``), keyed by the processor and the memory size.

A decode step reads every weight once (and the KV of the context so far), so tokens per
second is at most bandwidth / bytes read per token: the catalog's expected speed.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import platformdirs
import psutil

APP_NAME = "onnx-local-llm"
_BUFFER_BYTES = 256 * 1024 * 1024
_ROUNDS = 5


def cache_file() -> Path:
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "read_bandwidth.json"


def machine_key() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}|{os.cpu_count()} cpus|{psutil.virtual_memory().total} bytes"


def measure(buffer_bytes: int = _BUFFER_BYTES, rounds: int = _ROUNDS) -> float:
    """Bytes per second one thread reads (numpy's sum over a buffer larger than the
    caches); the best of ``rounds``."""
    data = np.ones(buffer_bytes // 8, dtype=np.float64)
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        data.sum()
        best = max(best, data.nbytes / max(time.perf_counter() - start, 1e-9))
    return best


def read_bandwidth(path: Path | None = None) -> float:
    """The cached figure for this machine, measured (about a second) when there is none."""
    path = path or cache_file()
    key = machine_key()
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("machine") == key and float(saved["bytes_per_second"]) > 0:
            return float(saved["bytes_per_second"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    value = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": key, "bytes_per_second": value,
                                    "measured": time.strftime("%Y-%m-%d")}) + "\n",
                        encoding="utf-8")
    except OSError:
        pass  # a read-only cache: measured again next time
    return value
