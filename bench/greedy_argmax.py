"""Is a greedy fast path worth it on the CPU? Full logits + numpy argmax vs an ArgMax node.

The candidate fast path adds `ArgMax(logits)` to the graph at load, so a greedy step
returns one token id and the `[1, 1, V]` logits never reach Python. On a GPU that saves a
device-to-host copy per token; on the CPU the logits are already in host memory (bound
in place), so the question is only which argmax is cheaper. Both arms run the same shared
KV buffer decode loop on the bench model, each in a fresh process, rotated, best of N.

    python -m bench.greedy_argmax [--model int4|fp32] [--rounds 6] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench._fresh import run_worker

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
STEPS = 256


def worker(model: Path, arm: str, threads: int) -> dict[str, Any]:
    import numpy as np
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(model / "model.onnx"), load_external_data=False)
    if arm == "argmax":
        proto.graph.node.append(onnx.helper.make_node(
            "ArgMax", ["logits"], ["next_token"], axis=-1, keepdims=0))
        proto.graph.output.append(onnx.helper.make_tensor_value_info(
            "next_token", onnx.TensorProto.INT64, ["batch_size", "sequence_length"]))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                  str(model))
    sess = ort.InferenceSession(proto.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    cap = 64 + STEPS
    heads = int(pasts[0].shape[1])
    head_dim = json.loads((model / "genai_config.json").read_text())["model"]["decoder"][
        "head_size"]
    binding = sess.io_binding()
    buffers = []
    for past in pasts:
        buf = np.zeros((1, heads, cap, head_dim), np.float32)
        buffers.append(buf)
        value = ort.OrtValue.ortvalue_from_numpy(buf)
        binding.bind_ortvalue_input(past.name, value)
        binding.bind_ortvalue_output(past.name.replace("past_key_values", "present"), value)
    vocab = int(sess.get_outputs()[0].shape[-1])
    mask = np.ones((1, cap), np.int64)
    prompt = np.arange(1, 33, dtype=np.int64).reshape(1, -1)
    logits = np.empty((1, 32, vocab), np.float32)
    binding.bind_input("input_ids", "cpu", 0, np.int64, [1, 32], prompt.ctypes.data)
    binding.bind_input("attention_mask", "cpu", 0, np.int64, [1, 32], mask.ctypes.data)
    binding.bind_output("logits", "cpu", 0, np.float32, [1, 32, vocab], logits.ctypes.data)
    if arm == "argmax":
        first = np.zeros((1, 32), np.int64)
        binding.bind_output("next_token", "cpu", 0, np.int64, [1, 32], first.ctypes.data)
    sess.run_with_iobinding(binding)
    token = int(logits[0, -1].argmax())
    step = np.zeros((1, 1), np.int64)
    binding.bind_input("input_ids", "cpu", 0, np.int64, [1, 1], step.ctypes.data)
    out_logits = np.empty((1, 1, vocab), np.float32)
    out_token = np.zeros((1, 1), np.int64)
    if arm == "argmax":
        binding.clear_binding_outputs()
        for past, buf in zip(pasts, buffers, strict=True):
            binding.bind_output(past.name.replace("past_key_values", "present"), "cpu", 0,
                                np.float32, list(buf.shape), buf.ctypes.data)
        binding.bind_output("next_token", "cpu", 0, np.int64, [1, 1], out_token.ctypes.data)
    else:
        binding.bind_output("logits", "cpu", 0, np.float32, [1, 1, vocab],
                            out_logits.ctypes.data)
    tokens = [token]
    start = time.perf_counter()
    for pos in range(32, 32 + STEPS - 1):
        step[0, 0] = tokens[-1]
        binding.bind_input("attention_mask", "cpu", 0, np.int64, [1, pos + 1],
                           mask.ctypes.data)
        sess.run_with_iobinding(binding)
        tokens.append(int(out_token[0, 0]) if arm == "argmax" else int(out_logits[0, 0].argmax()))
    elapsed = time.perf_counter() - start
    return {"arm": arm, "ms_per_token": elapsed / (STEPS - 1) * 1e3, "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("int4", "fp32"), default="int4")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", nargs=2, metavar=("MODEL_DIR", "ARM"))
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(Path(args.worker[0]), args.worker[1], args.threads)))
        return 0
    from bench.decode import build_models

    model = build_models(OUT, [args.model])[args.model]
    runs: dict[str, list[dict[str, Any]]] = {"logits": [], "argmax": []}
    for r in range(args.rounds):
        for arm in (("logits", "argmax") if r % 2 == 0 else ("argmax", "logits")):
            runs[arm].append(run_worker("bench.greedy_argmax", "--worker", str(model), arm,
                                        "--threads", str(args.threads), timeout=900))
    best = {arm: min(x["ms_per_token"] for x in rs) for arm, rs in runs.items()}
    same = runs["logits"][0]["tokens"] == runs["argmax"][0]["tokens"]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"greedy_argmax-{args.model}.json").write_text(json.dumps(
        {"model": str(model), "best_ms_per_token": best, "identical_tokens": same,
         "runs": {a: [x["ms_per_token"] for x in rs] for a, rs in runs.items()}}, indent=1))
    print(f"{args.model}: numpy argmax over bound logits {best['logits']:.3f} ms/token, "
          f"ArgMax node {best['argmax']:.3f} ms/token "
          f"(node/numpy {best['argmax'] / best['logits']:.3f}); identical tokens: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
