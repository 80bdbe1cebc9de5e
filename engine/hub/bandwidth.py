"""How fast this machine decodes, measured once and kept in the engine's cache folder
(``platformdirs.user_cache_dir``), keyed by the processor and the memory size.

A decode step reads every weight once (and the KV of the context so far), so tokens per
second is about the bytes a step can read per second over the bytes it reads. Two figures,
each measured once:

- **read bandwidth**: what a decode step's float matrix-vector products read per second,
  measured the way the engine runs them: ONNX Runtime with the engine's session options and
  threads, a chain of fp32 MatMuls of one row (256 MiB of weights), on huge pages as the
  engine's weights are after a load. A plain ``numpy`` sum
  on one thread (the figure used before) read half as fast as the engine's two threads and
  set the expected speed of fp32 models at half the measured one;
- **quantized efficiency**: quantized (int4) weights are not read at that rate, their
  kernels unpack them and the engine's loop and sampling add their time per token. The
  built-in model (int4) is decoded (64 greedy tokens, best of 3) and its speed times the bytes
  it reads over the bandwidth is the share of the bandwidth a quantized model gets (the
  figure before counted 1: 1.4x the measured speed for the built-in model).

``python -m bench.fit_speed`` sets the expected speed beside the measured one.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import platformdirs
import psutil

from engine.api import GenerateRequest
from engine.config import EngineConfig, GenerateOptions
from engine.engine import Engine
from engine.model.default_model import default_model_dir
from engine.model.onnx_proto import FLOAT
from engine.model.onnx_writer import OnnxWriter, tensor_info
from engine.runtime.hugepages import advise_huge_pages
from engine.runtime.providers import make_session

APP_NAME = "onnx-local-llm"
#: Bumped when the way of measuring changes: older figures are measured again.
VERSION = 2
_WEIGHT_BYTES = 256 * 1024 * 1024
_SIDE = 2048
#: Back to back, as decode steps run (a pause lets the threads sleep and the other
#: programs of a busy machine take a core: half the figure on a 2-core VM); the best round
#: is the machine's, not a moment when other programs held the cores.
_ROUNDS = 30
_EFFICIENCY_TOKENS = 64
_EFFICIENCY_ROUNDS = 3


@dataclass(frozen=True)
class ReadSpeed:
    """Bytes per second a decode step reads (float weights), and the share of it that a
    quantized model's step gets."""

    bytes_per_second: float
    quantized_efficiency: float = 1.0

    def for_weights(self, quantized: bool) -> float:
        return self.bytes_per_second * (self.quantized_efficiency if quantized else 1.0)


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


def measure(weight_bytes: int = _WEIGHT_BYTES, rounds: int = _ROUNDS) -> float:
    """Bytes per second the engine's ONNX Runtime session reads in fp32 matrix-vector
    products (one row by ``weight_bytes`` of [2048, 2048] weights, in a chain); the best
    of ``rounds``, back to back."""

    count = max(1, weight_bytes // (_SIDE * _SIDE * 4))
    with tempfile.TemporaryDirectory(prefix="read-bandwidth-") as folder:
        path = Path(folder) / "gemv.onnx"
        writer = OnnxWriter(path, "read_bandwidth")
        rng = np.random.default_rng(0)
        x = "x"
        for i in range(count):  # each product reads a fresh matrix: nothing stays cached
            w = rng.standard_normal((_SIDE, _SIDE), dtype=np.float32) / np.float32(_SIDE ** 0.5)
            x = writer.op("MatMul", x, writer.init(f"w{i}", w),
                          out="y" if i == count - 1 else None)
        writer.save([tensor_info("x", FLOAT, [1, _SIDE])], [tensor_info("y", FLOAT, [1, _SIDE])])
        session, _info = make_session(path, EngineConfig(provider="cpu"))
        feed = {"x": np.ones((1, _SIDE), np.float32)}
        session.run(None, feed)
        if sys.platform.startswith("linux"):  # as the engine backs its weights after a load
            advise_huge_pages()
        best = 0.0
        for _ in range(rounds):
            start = time.perf_counter()
            session.run(None, feed)
            best = max(best, count * _SIDE * _SIDE * 4 / max(time.perf_counter() - start,
                                                             1e-9))
        del session
    return best


def measure_quantized_efficiency(bytes_per_second: float,
                                 model: Path | None = None) -> tuple[float, str] | None:
    """The share of ``bytes_per_second`` a quantized model's decode gets: the built-in
    model (int4) decoded for 64 greedy tokens (best of 3); (share, the model's name), None when the
    model is not there."""

    folder = model or default_model_dir()
    if folder is None:
        return None
    engine = Engine.load(folder, EngineConfig(provider="cpu"))
    try:
        engine.wait_huge_pages(timeout=30)  # the steady state: weights on huge pages
        speed = 0.0
        for _ in range(_EFFICIENCY_ROUNDS):  # the best: other programs may hold the cores
            result = engine.generate(GenerateRequest(
                prompt="Write a short story about a lighthouse.", options=GenerateOptions(
                    max_new_tokens=_EFFICIENCY_TOKENS, temperature=0.0, stop_on_eos=False)))
            speed = max(speed, result.timings.decode_tok_s or 0.0)
        read = engine.model.weights_bytes + engine.spec.kv_bytes_per_token * _EFFICIENCY_TOKENS
    finally:
        engine.close()
    if not speed or bytes_per_second <= 0:
        return None
    return min(speed * read / bytes_per_second, 2.0), folder.name


def _saved(path: Path) -> dict[str, object]:
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict) or saved.get("machine") != machine_key() \
            or saved.get("version") != VERSION:
        return {}
    return saved


def _save(path: Path, record: dict[str, object]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**record, "machine": machine_key(), "version": VERSION,
                                    "measured": time.strftime("%Y-%m-%d")}) + "\n",
                        encoding="utf-8")
    except OSError:
        pass  # a read-only cache: measured again next time


def _positive(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def read_bandwidth(path: Path | None = None) -> float:
    """The cached read bandwidth for this machine, measured (a second or two) when there
    is none."""
    path = path or cache_file()
    saved = _saved(path)
    value = _positive(saved.get("bytes_per_second"))
    if value is None:
        value = measure()
        _save(path, {"bytes_per_second": value})
    return value


def read_speed(path: Path | None = None) -> ReadSpeed:
    """The read bandwidth and the quantized efficiency of this machine, each measured
    once (the efficiency: a few seconds, the built-in model loaded and decoded)."""
    path = path or cache_file()
    bandwidth = read_bandwidth(path)
    saved = _saved(path)
    efficiency = _positive(saved.get("quantized_efficiency"))
    if efficiency is None:
        found = measure_quantized_efficiency(bandwidth)
        if found is None:
            return ReadSpeed(bandwidth)
        efficiency = found[0]
        _save(path, {**saved, "bytes_per_second": bandwidth,
                     "quantized_efficiency": efficiency, "quantized_model": found[1]})
    return ReadSpeed(bandwidth, efficiency)
