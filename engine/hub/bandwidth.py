"""How fast this machine decodes, measured once and kept in the engine's cache folder
(``platformdirs.user_cache_dir``), keyed by the processor and the memory size.

A decode step reads every weight once (and the KV of the context so far), and pays a fixed
cost per layer (ONNX Runtime's dispatch of the layer's nodes, the engine's loop), so

    seconds per token = layers x per-layer cost + bytes read / read rate

Three figures, measured together once:

- **fp32 read rate**: what a decode step's float matrix-vector products read per second,
  measured the way the engine runs them: ONNX Runtime with the engine's session options and
  threads, a chain of fp32 MatMuls of one row (256 MiB of weights), on huge pages as the
  engine's weights are after a load;
- **int4 read rate**: the same chain in ``MatMulNBits`` (4 bits, blocks of 32, fp32 scales,
  int8 activations: what onnxruntime-genai's builder and the engine's GGUF import write),
  run by the engine's own MatMulNBits where the engine would run it (engine/kernels).
  Kernels unpack as they read: on the 2-core test VM this is 0.6 of the fp32 rate, not
  the 8x fewer bytes' worth. Before, a quantized model got a share of the fp32 rate
  measured on the built-in model's whole step, where the fixed per-layer cost is a third of
  the time: bigger models decoded 1.1-1.5x (up to 2.4x) faster than expected;
- **per-layer cost**: the built-in model (int4, 30 layers) decoded (64 greedy tokens),
  its step time less what its bytes take at the int4 rate, over its layers.

Each figure is the best of rounds interleaved with the others (``_ROUNDS``): on a shared
machine the best is the machine's own, not a moment when other programs held the cores;
figures taken apart in time read different loads (13-15 against 29-31 GB/s here).
``python -m bench.fit_speed`` and ``python -m bench.catalog_table`` set the expected speed
beside the measured one.
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

from engine import kernels
from engine.api import GenerateRequest
from engine.config import EngineConfig, GenerateOptions
from engine.engine import Engine
from engine.model.default_model import default_model_dir
from engine.model.matmul_pass import own_matmul_moves
from engine.model.onnx_proto import FLOAT
from engine.model.onnx_writer import MS_DOMAIN, OnnxWriter, tensor_info
from engine.runtime.hugepages import advise_huge_pages
from engine.runtime.providers import make_session

APP_NAME = "onnx-local-llm"
#: Bumped when the way of measuring changes: older figures are measured again.
VERSION = 4
_WEIGHT_BYTES = 256 * 1024 * 1024
_SIDE = 2048
_BLOCK = 32
#: Rounds of (fp32 chain, int4 chain, built-in model's decode), and runs of each chain in a
#: round back to back, as decode steps run (a pause lets the threads sleep and the other
#: programs of a busy machine take a core: half the figure on a 2-core VM).
_ROUNDS = 3
_RUNS = 10
_DECODE_TOKENS = 64


@dataclass(frozen=True)
class ReadSpeed:
    """What a decode step reads per second (fp32 and int4 weights) and what it pays per
    layer besides."""

    bytes_per_second: float
    int4_bytes_per_second: float | None = None
    layer_seconds: float = 0.0

    def for_weights(self, quantized: bool) -> float:
        if quantized and self.int4_bytes_per_second:
            return self.int4_bytes_per_second
        return self.bytes_per_second

    def tokens_per_second(self, read_bytes: int, layers: int, quantized: bool) -> float | None:
        """Tokens per second of a step reading ``read_bytes`` through ``layers`` layers."""
        rate = self.for_weights(quantized)
        seconds = max(layers, 0) * self.layer_seconds + read_bytes / rate if rate > 0 else 0
        return 1 / seconds if seconds > 0 else None


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


class _Chain:
    """A chain of matrix-vector products over ``weight_bytes`` of [2048, 2048] weights
    (each product a fresh matrix: nothing stays cached), in fp32 ``MatMul`` or int4
    ``MatMulNBits``, in an ONNX Runtime session as the engine makes them."""

    def __init__(self, folder: Path, int4: bool, weight_bytes: int = _WEIGHT_BYTES) -> None:
        per = _SIDE * _SIDE // _BLOCK * (_BLOCK // 2 + 4) if int4 else _SIDE * _SIDE * 4
        count = max(1, weight_bytes // per)
        self.bytes = count * per
        path = folder / ("int4.onnx" if int4 else "fp32.onnx")
        writer = OnnxWriter(path, "read_bandwidth")
        rng = np.random.default_rng(0)
        x = "x"
        for i in range(count):
            out = "y" if i == count - 1 else None
            if int4:
                codes = rng.integers(0, 256, (_SIDE, _SIDE // _BLOCK, _BLOCK // 2), np.uint8)
                scales = rng.uniform(1e-3, 2e-3, (_SIDE, _SIDE // _BLOCK)).astype(np.float32)
                x = writer.op("MatMulNBits", x, writer.init(f"q{i}", codes),
                              writer.init(f"s{i}", scales), domain=MS_DOMAIN, K=_SIDE, N=_SIDE,
                              bits=4, block_size=_BLOCK, accuracy_level=4, out=out)
            else:
                w = rng.standard_normal((_SIDE, _SIDE), np.float32) / np.float32(_SIDE ** 0.5)
                x = writer.op("MatMul", x, writer.init(f"w{i}", w), out=out)
        writer.save([tensor_info("x", FLOAT, [1, _SIDE])], [tensor_info("y", FLOAT, [1, _SIDE])])
        graph = None  # int4: the engine's own MatMulNBits where the engine would run it
        if int4 and kernels.matmul_on() and kernels.matmul_slow_reason() is None:
            graph = own_matmul_moves(path.read_bytes(), eight_bit=kernels.matmul_eight_bit(),
                                     fp32=kernels.matmul_fp32_fast())[0]
        self.session, _info = make_session(path, EngineConfig(provider="cpu"), graph=graph)
        self.feed = {"x": np.ones((1, _SIDE), np.float32)}
        self.session.run(None, self.feed)

    def best(self, runs: int = _RUNS) -> float:
        """Bytes per second, the best of ``runs`` back to back."""
        best = 0.0
        for _ in range(runs):
            start = time.perf_counter()
            self.session.run(None, self.feed)
            best = max(best, self.bytes / max(time.perf_counter() - start, 1e-9))
        return best


def _huge_pages() -> None:
    if sys.platform.startswith("linux"):  # as the engine backs its weights after a load
        advise_huge_pages()


def measure(weight_bytes: int = _WEIGHT_BYTES, rounds: int = 30) -> float:
    """Bytes per second the engine's ONNX Runtime session reads in fp32 matrix-vector
    products; the best of ``rounds``, back to back."""
    with tempfile.TemporaryDirectory(prefix="read-bandwidth-") as folder:
        chain = _Chain(Path(folder), False, weight_bytes)
        _huge_pages()
        return chain.best(rounds)


def measure_int4(weight_bytes: int = _WEIGHT_BYTES, rounds: int = 30) -> float:
    """Bytes per second of int4 weights (with their scales) the engine's session reads in
    ``MatMulNBits`` matrix-vector products; the best of ``rounds``, back to back."""
    with tempfile.TemporaryDirectory(prefix="read-bandwidth-") as folder:
        chain = _Chain(Path(folder), True, weight_bytes)
        _huge_pages()
        return chain.best(rounds)


class Probe:
    """The fp32 and int4 chains and the built-in model (int4; or ``model``), loaded once;
    :meth:`round` runs each once more. Close it (or use ``with``)."""

    def __init__(self, model: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="read-bandwidth-")
        self.fp32, self.int4 = _Chain(Path(self._tmp.name), False), _Chain(Path(self._tmp.name),
                                                                          True)
        folder = model or default_model_dir()
        self.name = folder.name if folder else ""
        self.engine = Engine.load(folder, EngineConfig(provider="cpu")) if folder else None
        self.read, self.layers, self.rotary = 0, 1, 0
        if self.engine is not None:
            self.engine.wait_huge_pages(timeout=30)  # the steady state: weights on huge pages
            spec = self.engine.spec
            context = self.engine.model.context_length  # the tables cover all of it
            self.rotary = rotary_bytes(spec.kv_pairs[0].head_dim, context)
            self.read = (self.engine.model.weights_bytes - self.rotary
                         + spec.kv_bytes_per_token * _DECODE_TOKENS)
            self.layers = max(1, len(spec.kv_pairs) // 2)
        _huge_pages()

    def round(self) -> tuple[float, float, float]:
        """(fp32 bytes/s, int4 bytes/s, the model's decode tokens/s; 0 without a model)."""
        fp32, int4, tokens = self.fp32.best(), self.int4.best(), 0.0
        if self.engine is not None:
            result = self.engine.generate(GenerateRequest(
                prompt="Write a short story about a lighthouse.", options=GenerateOptions(
                    max_new_tokens=_DECODE_TOKENS, temperature=0.0, stop_on_eos=False,
                    speculative_mode="none")))  # one token a step: what the figure is of
            tokens = result.timings.decode_tok_s or 0.0
        return fp32, int4, tokens

    def speed(self, fp32: float, int4: float, tokens: float) -> ReadSpeed:
        """The figures from a round's (or the best rounds') numbers: the per-layer cost is
        the model's step time less what its bytes take at the int4 rate, over its layers."""
        layer = max(0.0, (1 / tokens - self.read / int4) / self.layers) if tokens > 0 else 0.0
        return ReadSpeed(fp32, int4, layer)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self._tmp.cleanup()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_speed(model: Path | None = None, rounds: int = _ROUNDS) -> tuple[ReadSpeed, str]:
    """The three figures from ``rounds`` rounds of the fp32 chain, the int4 chain and a
    64-token greedy decode of ``model`` (default: the built-in model; int4), each the best
    of its rounds; (figures, the model's name). Without the model: no per-layer cost."""
    with Probe(model) as probe:
        found = [probe.round() for _ in range(rounds)]
        best = [max(r[i] for r in found) for i in range(3)]
        return probe.speed(*best), probe.name


def rotary_bytes(head_dim: int, context: int) -> int:
    """The rotary cos and sin tables of an export (fp32, half the head size per position
    of the whole context): in the weights, read one row a step."""
    return 2 * context * (head_dim // 2) * 4


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
    """The cached fp32 read rate for this machine, measured (a second or two) when there
    is none."""
    path = path or cache_file()
    saved = _saved(path)
    value = _positive(saved.get("bytes_per_second"))
    if value is None:
        value = measure()
        _save(path, {**saved, "bytes_per_second": value})
    return value


def read_speed(path: Path | None = None) -> ReadSpeed:
    """The figures of this machine, measured once (a few seconds: the two chains and the
    built-in model loaded and decoded) and cached."""
    path = path or cache_file()
    saved = _saved(path)
    fp32, int4 = _positive(saved.get("bytes_per_second")), _positive(
        saved.get("int4_bytes_per_second"))
    layer = saved.get("layer_seconds")
    if fp32 is None or int4 is None or not isinstance(layer, (int, float)) or layer < 0:
        speed, name = measure_speed()
        _save(path, {"bytes_per_second": speed.bytes_per_second,
                     "int4_bytes_per_second": speed.int4_bytes_per_second,
                     "layer_seconds": speed.layer_seconds, "layer_model": name})
        return speed
    return ReadSpeed(fp32, int4, float(layer))
