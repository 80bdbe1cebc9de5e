"""Attention alone: the engine's kernel (engine/kernels) against ONNX Runtime's.

One decode step's attention (or, with ``--new N``, a prefill chunk of N tokens) for every
layer of the built-in model's shape (30 layers, 9 query heads over 3 KV heads of 64 unless
``--shape`` says otherwise, RoPE in the node, fp32 cache shared by past and present as
the engine binds it): a graph of 30 GroupQueryAttention nodes, run with the
node in ONNX Runtime's domain (``ort``) or moved to the engine's (``ours``, and
``ours-avx2`` and ``ours-portable``: its AVX2 or plain C loops instead of AVX-512;
``ours-i8``, ``ours-i8-avx2``: GroupQueryAttentionI8KV over an int8 cache (rows of
int8 values and a scale); where the CPU has AMX-BF16 the int8 and float16 arms' scores
run on the tile unit;
``ours-avx512``, ``ours-f16-avx512``, ``ours-i8-avx512``: the same without AMX;
``ours-i16``, ``ours-i16-avx2``,
``ours-i16-portable``: GroupQueryAttentionI16KV over an int16 cache (rows of whole numbers
and a scale; VPDPWSSD where the CPU has AVX-512 VNNI, with ``-avx2`` its 256-bit form where
the CPU has AVX-VNNI, else plain C);
``ours-f16``, ``ours-f16-avx2``, ``ours-f16-portable``: GroupQueryAttentionF16KV over a
float16 cache; ``base``, ``base-f16`` and ``base-i16``: the fp32, float16-KV and int16-KV
operators of the library at ``--base-library``, another build to compare with), at
several cache lengths (the length after the run: ``--new`` 512 at 2,012 is a chunk of
512 tokens after 1,500). Every arm
and length runs in a fresh process, order rotated each round; the best of the rounds
counts. Reports ms per step (30 layers), the cache bytes read per ms (each position's key
and value once per KV head), and the ratios.

    .venv/bin/python -m bench.attention [--lens 512,2000,4000,8000] [--rounds 5] [--threads 2]
                                        [--new 1] [--arms ort,ours,ours-f16,...]
                                        [--base-library PATH] [--shape 9,3,64]

Writes bench/out/attention.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._fresh import run_worker  # noqa: E402
from engine.model.kv16_pass import I8_SCALE_BYTES, I16_SCALE_ELEMS  # noqa: E402

OUT = REPO / "bench" / "out"
ARMS = ("ort", "ours", "ours-f16", "ours-avx2", "ours-portable")
MORE_ARMS = ("ours-f16-avx2", "ours-f16-portable", "base", "base-f16", "base-i16", "ours-i8",
             "ours-i8-avx2",
             "ours-avx512", "ours-f16-avx512", "ours-i8-avx512", "ours-i16", "ours-i16-avx2",
             "ours-i16-portable")
LAYERS, HEADS, KV_HEADS, HEAD = 30, 9, 3, 64


def _graph(domain: str, capacity: int, new: int, f16: bool = False, i8: bool = False,
           i16: bool = False) -> bytes:
    from onnx import TensorProto, helper

    from engine.model.graph_passes import KERNEL_DOMAIN

    width = (HEADS + 2 * KV_HEADS) * HEAD
    inputs = [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, new, width]),
              helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, []),
              helper.make_tensor_value_info("cos", TensorProto.FLOAT, [capacity, HEAD // 2]),
              helper.make_tensor_value_info("sin", TensorProto.FLOAT, [capacity, HEAD // 2])]
    nodes, outputs = [], []
    cache = [1, KV_HEADS, capacity,
             HEAD + (I8_SCALE_BYTES if i8 else I16_SCALE_ELEMS if i16 else 0)]
    kv_type = TensorProto.INT8 if i8 else TensorProto.INT16 if i16 else \
        TensorProto.FLOAT16 if f16 else TensorProto.FLOAT
    op = "GroupQueryAttentionI8KV" if i8 else "GroupQueryAttentionI16KV" if i16 else \
        "GroupQueryAttentionF16KV" if f16 else "GroupQueryAttention"
    for i in range(LAYERS):
        nodes.append(helper.make_node(
            op,
            ["qkv", "", "", f"pk{i}", f"pv{i}", "seqlens", "total", "cos", "sin"],
            [f"o{i}", f"k{i}", f"v{i}"],
            domain=domain, num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1,
            scale=HEAD ** -0.5))
        inputs += [helper.make_tensor_value_info(f"p{kv}{i}", kv_type, cache) for kv in "kv"]
        outputs += [helper.make_tensor_value_info(f"o{i}", TensorProto.FLOAT,
                                                  [1, new, HEADS * HEAD])]
        outputs += [helper.make_tensor_value_info(f"{kv}{i}", kv_type, cache) for kv in "kv"]
    model = helper.make_model(
        helper.make_graph(nodes, "attention", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
                       helper.make_opsetid(KERNEL_DOMAIN, 1)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def worker(arm: str, length: int, threads: int, steps: int, new: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    from engine import kernels
    from engine.config import SPIN_US
    from engine.model.graph_passes import KERNEL_DOMAIN

    f16 = arm.startswith("ours-f16") or arm == "base-f16"
    i8 = arm.startswith("ours-i8")
    i16 = arm.startswith("ours-i16") or arm == "base-i16"
    library = kernels.library()
    if arm != "ort" and library is None:
        raise SystemExit("engine/kernels is not built (pip install -e . with a C compiler)")
    capacity = length + 64
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_US))
    if library is not None:
        options.register_custom_ops_library(str(library))
    session = ort.InferenceSession(
        _graph("com.microsoft" if arm == "ort" else KERNEL_DOMAIN, capacity, new, f16, i8, i16),
        options,
        providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    binding = session.io_binding()
    keep = []
    for i in range(LAYERS):
        for kv in "kv":
            cache = rng.standard_normal((1, KV_HEADS, capacity, HEAD), dtype=np.float32)
            if i8 or i16:
                from engine.kv.quant import float_to_rows
                cache = float_to_rows(cache, "int16" if i16 else "int8")
            cache = cache.astype(np.float16) if f16 else cache
            keep.append(cache)
            binding.bind_input(f"p{kv}{i}", "cpu", 0, cache.dtype, cache.shape, cache.ctypes.data)
            binding.bind_output(f"{kv}{i}", "cpu", 0, cache.dtype, cache.shape, cache.ctypes.data)
        binding.bind_output(f"o{i}", "cpu")
    angles = np.arange(capacity)[:, None] * 10000.0 ** (-np.arange(HEAD // 2) / (HEAD // 2))
    binding.bind_cpu_input("cos", np.cos(angles).astype(np.float32))
    binding.bind_cpu_input("sin", np.sin(angles).astype(np.float32))
    binding.bind_cpu_input("qkv", rng.standard_normal(
        (1, new, (HEADS + 2 * KV_HEADS) * HEAD), dtype=np.float32))
    binding.bind_cpu_input("seqlens", np.array([length - 1], np.int32))
    binding.bind_cpu_input("total", np.array(length, np.int32))
    for _ in range(5):
        session.run_with_iobinding(binding)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append(time.perf_counter() - start)
    times.sort()
    ms = times[len(times) // 2] * 1e3
    # cache bytes a token's row
    row = HEAD + I8_SCALE_BYTES if i8 else 2 * (HEAD + I16_SCALE_ELEMS) if i16 else \
        HEAD * (2 if f16 else 4)
    read = LAYERS * 2 * KV_HEADS * length * row  # cache bytes a step reads
    return {"arm": arm, "length": length, "new": new, "step_ms": ms, "best_ms": times[0] * 1e3,
            "gb_s": read / ms / 1e6}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lens", default="512,2000,4000,8000")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--new", type=int, default=1, help="new tokens per run (1: a decode step)")
    p.add_argument("--shape", default="9,3,64",
                   help="query heads, KV heads, head size (default: the built-in model's)")
    p.add_argument("--arms", default=",".join(ARMS),
                   help=f"which arms, of {', '.join(ARMS + MORE_ARMS)}")
    p.add_argument("--base-library", default="",
                   help="the library whose operators the arms 'base', 'base-f16' and "
                        "'base-i16' run")
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    global HEADS, KV_HEADS, HEAD
    try:
        HEADS, KV_HEADS, HEAD = (int(n) for n in args.shape.split(","))
    except ValueError:
        p.error(f"--shape: expected three whole numbers such as 9,3,64, got {args.shape!r}")
    if args.worker:
        arm, length = args.worker[0], int(args.worker[1])
        if arm.endswith(("-portable", "-avx2", "-avx512")):
            os.environ["ONNX_GENAI_KERNELS"] = arm.rpartition("-")[2]
        if arm.startswith("base"):
            os.environ["ONNX_GENAI_KERNELS_LIBRARY"] = args.base_library
        print(json.dumps(worker(arm, length, args.threads, args.steps, args.new)), flush=True)
        return 0
    lens = [int(n) for n in args.lens.split(",") if n]
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS + MORE_ARMS]
    wants_base = any(a.startswith("base") for a in arms)
    if unknown or (wants_base and not Path(args.base_library).is_file()):
        p.error(f"unknown arms {unknown} (known: {', '.join(ARMS + MORE_ARMS)})" if unknown
                else "the arms 'base', 'base-f16' and 'base-i16' need --base-library PATH, a "
                     "built library")
    jobs = [(a, n) for n in lens for a in arms]
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        shift = (rnd * 5) % len(jobs)
        for arm, n in jobs[shift:] + jobs[:shift]:
            result = run_worker("bench.attention", "--threads", str(args.threads), "--steps",
                                str(args.steps), "--new", str(args.new), "--base-library",
                                args.base_library, "--shape", args.shape, "--worker", arm,
                                str(n))
            runs.append({**result, "round": rnd, "loadavg": os.getloadavg()})
            print(f"round {rnd} {arm} {n}: {result['step_ms']:.2f} ms", flush=True)
    others = [a for a in arms if a != "ours"]
    ratios = [f"{a} / ours" for a in others] if "ours" in arms else []
    print(f"\n{args.new} new token(s) a run; best of {args.rounds} rounds\n\n| cache length | "
          f"ms per run (30 layers) {' / '.join(arms)} | GB/s of cache read, "
          f"{' / '.join(arms)} | {' | '.join(ratios)} |")
    print("|---|---|---|" + "---|" * len(ratios))
    summary: dict[str, Any] = {}
    for n in lens:
        mine = [r for r in runs if r["length"] == n]
        best = {a: min(r["step_ms"] for r in mine if r["arm"] == a) for a in arms}
        gb_s = {a: max(r["gb_s"] for r in mine if r["arm"] == a) for a in arms}
        summary[str(n)] = {**best, "gb_s": gb_s,
                           **{f"{a}/ours": best[a] / best["ours"] for a in others
                              if "ours" in arms}}
        row = [f"{best[a] / best['ours']:.2f}" for a in others] if "ours" in arms else []
        print(f"| {n} | {' / '.join(f'{best[a]:.2f}' for a in arms)} | "
              f"{' / '.join(f'{gb_s[a]:.1f}' for a in arms)} | {' | '.join(row)} |")
    OUT.mkdir(parents=True, exist_ok=True)
    name = "attention.json" if args.new == 1 else f"attention-new{args.new}.json"
    (OUT / name).write_text(json.dumps(
        {"summary": summary, "runs": runs, "rounds": args.rounds, "threads": args.threads,
         "new": args.new},
        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
