"""What ONNX Runtime's int4 kernel allows on this machine: the ceiling under the int4 targets.

Three measurements on the int4 bench model of ``bench.decode`` (12 layers, hidden 768,
vocab 32k, ``MatMulNBits`` with block 32 and accuracy level 4), ONNX Runtime alone, no
engine loop around it:

1. **Rows per step.** One decode step for 1, 2 and 4 sequences in one run (shared-buffer
   KV bound in place, as the engine batches): the aggregate scaling ``4 x t1 / t4`` is the
   most any scheduler on this graph can get from batching 4 streams (goal of issue 4:
   2.5x).
2. **One MatMulNBits per shape.** Each weight shape of the model as a one-node graph at
   M = 1, 2, 4, 8 rows: how the kernel's cost grows with rows when its weights are in cache.
3. **Rewrites that leave the output identical.** The gate and up projections fused into
   one ``MatMulNBits`` (and a ``Split``), and ORT's ``mlas.use_lut_gemm``: step time
   against the original, and whether the logits stay bit-identical. A rewrite that is
   faster without changing a bit would be an engine gain over onnxruntime-genai, which
   runs the graph as it is (goal of issue 2: 1.10x).

Every variant runs in a fresh process per round, the order rotates, best of ``--rounds``.

    .venv/bin/python -m bench.int4_ceiling [--rounds 5] [--threads 2]

Writes bench/out/int4_ceiling.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._fresh import run_worker  # noqa: E402

OUT = REPO / "bench" / "out"
VARIANTS = ("original", "fused-gate-up", "lut-gemm")
ROWS = (1, 2, 4)
STEPS = 60


def fuse_gate_up(src: Path, dst: Path) -> int:
    """Copy the model at ``src`` to ``dst`` with every pair of ``MatMulNBits`` nodes that
    read the same input and share K, bits, block size and accuracy level fused into one node
    (weights, scales and zero points concatenated along N) followed by a ``Split``. Each
    output column is computed from the same weights and the same quantized input as before.
    Returns the number of pairs fused."""
    import shutil

    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src / "model.onnx"))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            readers.setdefault(node.input[0], []).append(node)

    def attrs(node: Any) -> dict[str, Any]:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    replace: dict[str, list[Any]] = {}
    drop: set[str] = set()
    for source, pair in readers.items():
        if len(pair) != 2:
            continue
        a, b = pair
        aa, ab = attrs(a), attrs(b)
        if any(aa.get(k) != ab.get(k) for k in ("K", "bits", "block_size", "accuracy_level")) \
                or len(a.input) != len(b.input) or len(a.input) > 4:
            continue
        inputs = [source]
        for slot in range(1, len(a.input)):  # weights, scales, zero points
            joined = np.concatenate([numpy_helper.to_array(inits[a.input[slot]]),
                                     numpy_helper.to_array(inits[b.input[slot]])], axis=0)
            name = f"{a.input[slot]}.fused"
            graph.initializer.append(numpy_helper.from_array(joined, name))
            inputs.append(name)
        sizes = f"{a.name}.split_sizes"
        graph.initializer.append(numpy_helper.from_array(
            np.array([aa["N"], ab["N"]], dtype=np.int64), sizes))
        fused = helper.make_node(
            "MatMulNBits", inputs, [f"{a.output[0]}.fused"], name=f"{a.name}.fused",
            domain="com.microsoft", K=aa["K"], N=aa["N"] + ab["N"], bits=aa["bits"],
            block_size=aa["block_size"], accuracy_level=aa.get("accuracy_level", 0))
        split = helper.make_node("Split", [f"{a.output[0]}.fused", sizes],
                                 [a.output[0], b.output[0]], name=f"{a.name}.split", axis=-1)
        replace[a.name] = [fused, split]
        drop.add(b.name)
    nodes = []
    for node in graph.node:
        if node.name in drop:
            continue
        nodes.extend(replace.get(node.name, [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.name.startswith("model.onnx"):
            shutil.copy(f, dst / f.name)
    onnx.save(model, str(dst / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data")
    return len(replace)


def _session(model: Path, threads: int, lut: bool) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if lut:
        options.add_session_config_entry("mlas.use_lut_gemm", "1")
    return ort.InferenceSession(str(model / "model.onnx"), options,
                                providers=["CPUExecutionProvider"])


def step_worker(model: Path, threads: int, lut: bool) -> dict[str, Any]:
    """ms per decode step with 1, 2 and 4 rows (best of 5 blocks of STEPS), and the logits
    of one fixed step (to compare variants bit for bit)."""
    import numpy as np

    from engine.model.io_spec import resolve_io
    from engine.model.model_dir import load_model_dir
    from engine.runtime.decode_gqa import KVBank

    info = load_model_dir(model)
    spec = resolve_io(info.graph.inputs, info.graph.outputs, info.declared,
                      has_gqa=info.graph.has_gqa, source=info.format)
    session = _session(model, threads, lut)
    bank = KVBank(session, spec, 512, max_rows=max(ROWS))
    runners = [bank.add_runner() for _ in range(max(ROWS))]
    for k, runner in enumerate(runners):
        runner.reserve(32 + 5 * STEPS + 8)
        runner.forward(np.arange(1 + k, 33 + k, dtype=np.int64))
    probe = np.asarray(bank.forward_batch(runners[:1], [7])).copy()
    runners[0].rewind(1)
    ms: dict[str, float] = {}
    for rows in ROWS:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(STEPS):
                bank.forward_batch(runners[:rows], [5] * rows)
            best = min(best, (time.perf_counter() - t0) / STEPS)
            for runner in runners[:rows]:
                runner.rewind(STEPS)
        ms[str(rows)] = best * 1e3
    return {"ms_per_step": ms, "probe_logits": probe.ravel().tolist()[:4096],
            "probe_argmax": int(probe.argmax())}


def op_worker(threads: int) -> dict[str, Any]:
    """One MatMulNBits per weight shape of the bench model: µs at M = 1, 2, 4, 8 rows."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    shapes = {"qkv 768x1280": (768, 1280), "o 768x768": (768, 768),
              "gate/up 768x2048": (768, 2048), "down 2048x768": (2048, 768),
              "lm_head 768x32000": (768, 32000)}
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for label, (k, n) in shapes.items():
        weight = numpy_helper.from_array((rng.standard_normal((k, n)) * 0.02)
                                         .astype(np.float32), "w")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["a", "w"], ["y"])], "one",
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["M", k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])], [weight])
        quant = MatMulNBitsQuantizer(helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17)]), block_size=32,
            is_symmetric=False, accuracy_level=4)
        quant.process()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        session = ort.InferenceSession(quant.model.model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        out[label] = {}
        for m in (1, 2, 4, 8):
            a = rng.random((m, k), dtype=np.float32)
            for _ in range(30):
                session.run(None, {"a": a})
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(200):
                    session.run(None, {"a": a})
                best = min(best, (time.perf_counter() - t0) / 200)
            out[label][str(m)] = best * 1e6
    return {"op_us": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", choices=(*VARIANTS, "ops"))
    ap.add_argument("--model", type=Path)
    args = ap.parse_args(argv)
    if args.worker == "ops":
        print(json.dumps(op_worker(args.threads)))
        return 0
    if args.worker:
        print(json.dumps(step_worker(args.model, args.threads, args.worker == "lut-gemm")))
        return 0

    from bench.decode import build_models

    original = build_models(OUT, ["int4"])["int4"]
    fused = original.with_name(original.name + "-fused-gate-up")
    if not fused.is_dir():
        print(f"fused {fuse_gate_up(original, fused)} gate/up pairs into {fused}",
              file=sys.stderr)
    models = {"original": original, "fused-gate-up": fused, "lut-gemm": original}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for variant in order:
            runs[variant].append(run_worker("bench.int4_ceiling", "--worker", variant,
                                            "--model", str(models[variant]),
                                            "--threads", str(args.threads)))
    ops = run_worker("bench.int4_ceiling", "--worker", "ops", "--threads", str(args.threads))

    best = {v: {rows: min(run["ms_per_step"][rows] for run in runs[v]) for rows in
                ("1", "2", "4")} for v in VARIANTS}
    reference = runs["original"][0]["probe_logits"]
    identical = {v: all(run["probe_logits"] == reference for run in runs[v])
                 for v in VARIANTS}
    print(f"ms per decode step, ONNX Runtime alone, best of {args.rounds} fresh processes")
    print("| variant | 1 row | 2 rows | 4 rows | 4-row scaling | vs original, 1 row | "
          "logits |")
    print("|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        b = best[v]
        print(f"| {v} | {b['1']:.3f} | {b['2']:.3f} | {b['4']:.3f} | "
              f"{4 * b['1'] / b['4']:.2f}x | {best['original']['1'] / b['1']:.3f}x | "
              f"{'identical' if identical[v] else 'DIFFERENT'} |")
    print("\nµs per MatMulNBits (accuracy level 4, block 32), weights in cache")
    print("| weights | M=1 | M=2 | M=4 | M=8 | M=4 / M=1 |")
    print("|---|---|---|---|---|---|")
    for label, us in ops["op_us"].items():
        print(f"| {label} | {us['1']:.1f} | {us['2']:.1f} | {us['4']:.1f} | {us['8']:.1f} | "
              f"{us['4'] / us['1']:.2f} |")
    OUT.mkdir(parents=True, exist_ok=True)
    for v in VARIANTS:
        for run in runs[v]:
            run.pop("probe_logits")
    (OUT / "int4_ceiling.json").write_text(json.dumps(
        {"model": str(original), "threads": args.threads, "rounds": args.rounds,
         "runs": runs, "best_ms_per_step": best, "logits_identical": identical,
         "ops": ops["op_us"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
