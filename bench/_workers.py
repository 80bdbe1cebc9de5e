"""Worker side of bench/decode.py: one model, one timed generation, in a fresh process.

Each worker does a short warm-up generation, then the timed one, and returns a dict that
`bench.decode` prints as one JSON line. Heavy imports stay inside the functions so an `og`
worker never loads our engine and an `ours` worker never loads onnxruntime-genai.

Clock, the same for both engines: TTFT runs from the request start (our `stream()` call;
og's GeneratorParams + Generator creation) to the first generated token being known.
Decode tok/s = tokens after the first / time from the first token to the last one.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

WARMUP_PROMPT = 8
WARMUP_NEW = 8


def prompt_ids(vocab: int, n: int, seed: int) -> list[int]:
    """Fixed pseudo-random prompt ids in 1..vocab-1 (0 is the forge's EOS)."""
    return [int(t) for t in np.random.default_rng(seed).integers(1, vocab, size=n)]


def peak_rss_mib() -> float:
    """Peak resident set of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def proc_status_mib() -> dict[str, float]:
    """VmHWM (unlike ru_maxrss it does not inherit the parent's peak), and the current
    anonymous / file-backed (mmapped weights) resident sets, from /proc/self/status."""
    keys = {"VmHWM:": "vm_hwm_mib", "RssAnon:": "rss_anon_mib", "RssFile:": "rss_file_mib"}
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(maxsplit=1)[0] if line else ""
        if key in keys:
            out[keys[key]] = int(line.split()[1]) / 1024.0
    return out


def idle_cpu(seconds: float) -> float:
    """CPU seconds per second this process burns while it waits after a request (spinning
    threads, timers); 0.0 when `seconds` is 0."""
    if seconds <= 0:
        return 0.0
    before = os.times()
    time.sleep(seconds)
    after = os.times()
    return (after.user + after.system - before.user - before.system) / seconds


def engine_fingerprint() -> str:
    """Hash of engine/**/*.py: the engine may change between runs of a long benchmark."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1] / "engine"
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def model_vocab(model: Path) -> int:
    return int(json.loads((model / "genai_config.json").read_text())["model"]["vocab_size"])


def run_ours(model: Path, prompt: list[int], warmup: list[int], new_tokens: int,
             threads: int, spin: bool, speculative_mode: str = "none",
             huge_pages: bool = True, idle_s: float = 0.0,
             prune_logits: bool = True, own_kernels: bool = True) -> dict[str, Any]:
    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest

    # `ours` is the engine's default (a 20 µs spin, engine.config.SPIN_US); `ours-nospin`
    # never spins (see bench.spin).
    # `ours-4k` leaves the weights on 4 KiB pages (EngineConfig.huge_pages off): what the
    # huge-page advice gains.
    knob: dict[str, Any] = {} if spin else {"spin_duration_us": 0}
    knob["huge_pages"] = huge_pages
    # prune_logits off: the LM head runs for every prompt row, as the graph was exported
    knob["prune_logits"] = prune_logits
    # own_kernels off: ONNX Runtime's GroupQueryAttention kernel instead of engine/kernels
    knob["own_kernels"] = own_kernels
    t0 = time.perf_counter()
    eng = Engine.load(model, EngineConfig(intra_op_threads=threads, **knob))
    load_ms = (time.perf_counter() - t0) * 1e3
    # the huge-page collapse runs in the background after a load; an app serves for
    # minutes after one load, so the timed run starts once it is done (its time is kept)
    t0 = time.perf_counter()
    eng.wait_huge_pages()
    huge_pages_wait_ms = (time.perf_counter() - t0) * 1e3

    def generate(ids: list[int], n: int) -> Any:
        opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=n,
                               speculative_mode=speculative_mode)
        return eng.generate(GenerateRequest(token_ids=tuple(ids), options=opts))

    first_ttft_ms = generate(warmup, WARMUP_NEW).timings.ttft_ms  # the first request
    t0 = time.perf_counter()
    res = generate(prompt, new_tokens)
    wall_ms = (time.perf_counter() - t0) * 1e3
    idle = idle_cpu(idle_s)
    t = res.timings
    return {"ttft_ms": t.ttft_ms, "prefill_tok_s": t.prefill_tok_s,
            "decode_tok_s": t.decode_tok_s, "wall_ms": wall_ms, "load_ms": load_ms,
            "decode_path": eng.decode_path, "engine": engine_fingerprint(),
            "engine_config": repr(eng.config), "huge_pages": eng.describe()["huge_pages"],
            "huge_pages_wait_ms": huge_pages_wait_ms, "first_ttft_ms": first_ttft_ms,
            "idle_cpu": idle,
            "prefix_cache_hit_len": getattr(res, "prefix_cache_hit_len", 0),
            "speculation": res.speculation.as_dict() if res.speculation else None,
            **{f"live_{k}": v for k, v in proc_status_mib().items()},
            "tokens": list(res.token_ids)}


def run_og(model: Path, prompt: list[int], warmup: list[int], new_tokens: int,
           threads: int, idle_s: float = 0.0, spin_us: int | None = None) -> dict[str, Any]:
    """onnxruntime-genai's clock of run_ours; `spin_us` gives its session the bounded
    thread spin our engine uses (og passes string session options to ONNX Runtime as
    session config entries), None leaves ONNX Runtime's own spin, og's default."""
    import onnxruntime_genai as og

    t0 = time.perf_counter()
    config = og.Config(str(model))
    session_options: dict[str, Any] = {"intra_op_num_threads": threads}
    if spin_us is not None:
        session_options["session.intra_op.spin_duration_us"] = str(spin_us)
    overlay = {"model": {"decoder": {"session_options": session_options}}}
    config.overlay(json.dumps(overlay))
    if os.environ.get("ONNX_GENAI_BACKEND", "").strip().lower() == "cuda":
        config.clear_providers()  # the GPU check (tools/gpu_check.sh) compares on CUDA
        config.append_provider("cuda")
    og_model = og.Model(config)
    load_ms = (time.perf_counter() - t0) * 1e3

    def generate(ids: list[int], n: int) -> dict[str, Any]:
        start = time.perf_counter()
        params = og.GeneratorParams(og_model)
        total = len(ids) + n
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        gen = og.Generator(og_model, params)
        created = time.perf_counter()
        gen.append_tokens(np.asarray(ids, dtype=np.int32))  # computes the first logits
        prefilled = time.perf_counter()
        gen.generate_next_token()  # picks the first token from those logits
        first = time.perf_counter()
        for _ in range(n - 1):
            gen.generate_next_token()
        last = time.perf_counter()
        if not gen.is_done():
            raise RuntimeError("og generator is not done after max_length tokens")
        tokens = [int(t) for t in gen.get_sequence(0)][len(ids):]
        ttft = first - start
        return {"ttft_ms": ttft * 1e3, "prefill_tok_s": len(ids) / ttft,
                "decode_tok_s": (n - 1) / (last - first) if n > 1 else 0.0,
                "wall_ms": (last - start) * 1e3, "og_create_ms": (created - start) * 1e3,
                "og_append_ms": (prefilled - created) * 1e3,
                "og_first_pick_ms": (first - prefilled) * 1e3, "tokens": tokens}

    first_ttft_ms = generate(warmup, WARMUP_NEW)["ttft_ms"]  # the first request
    out = generate(prompt, new_tokens)
    out["idle_cpu"] = idle_cpu(idle_s)
    out["load_ms"] = load_ms
    out["first_ttft_ms"] = first_ttft_ms
    out.update({f"live_{k}": v for k, v in proc_status_mib().items()})
    return out


def run_bandwidth(threads: int, mib: int = 512, repeats: int = 7) -> dict[str, Any]:
    """Best-of-N read bandwidth of an ORT ReduceSum over a `mib` MiB float32 tensor.

    Shape [1024, cols] reduced over the last axis: ORT splits the rows over the intra-op
    threads, so `threads` cores stream the input once each run.
    """
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rows = 1024
    cols = mib * 2**20 // 4 // rows
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], "bandwidth",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows])], initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    x = np.full((rows, cols), 1.0, np.float32)  # written, so every page is resident
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        (y,) = sess.run(None, {"x": x})
        best = min(best, time.perf_counter() - t0)
    if abs(float(y[0]) - cols) > 1e-3 * cols:
        raise RuntimeError(f"ReduceSum gave {y[0]}, expected {cols}")
    return {"threads": threads, "bytes": x.nbytes, "best_s": best,
            "gb_s": x.nbytes / best / 1e9}
