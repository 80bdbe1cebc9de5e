"""A sliding window with attention sinks against full attention, on a real model.

The model folder (default: the built-in model) is re-described with ``inference_metadata.yaml``
declaring ``sliding_window: W`` and ``attention_sinks: S`` (engine.kv.window), its files
hard-linked where they can be. Each arm reads one held-out text (this repository's own
docs) teacher-forced, in chunks of 64 tokens, and scores every next token: the mean negative
log-likelihood (nats a token) over the positions past the first drop, and how often its
top-1 token is full attention's there. Then 32 greedy decode steps at the end of the text:
ms a step, and the KV rows held. Without sinks (S = 0) the window shows what StreamingLLM
found: the first tokens soak up attention, and dropping them costs far more than dropping
the middle.

    .venv/bin/python -m bench.window [--model DIR] [--tokens 1536]
        [--arms full,256+4,256+0,512+4,512+0]

Writes bench/out/window.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUT = REPO / "bench" / "out"
BUILTIN = REPO / "resources" / "models" / "smollm2-135m-instruct"
#: Held-out text: this repository's own pages, in this order.
SOURCES = ("docs/kv-and-scheduling.md", "docs/worker.md", "docs/models.md")
CHUNK = 64


def _text() -> str:
    return "\n\n".join((REPO / f).read_text(encoding="utf-8") for f in SOURCES)


def windowed_folder(model: Path, out: Path, window: int, sinks: int) -> Path:
    """`model` (a genai folder) described by inference_metadata.yaml with a window."""
    cfg = json.loads((model / "genai_config.json").read_text(encoding="utf-8"))["model"]
    decoder = cfg["decoder"]
    out.mkdir(parents=True)
    for item in model.iterdir():
        if item.name != "genai_config.json" and item.is_file():
            try:  # ONNX Runtime refuses external data behind a link out of the folder
                os.link(item.resolve(), out / item.name)
            except OSError:
                shutil.copy2(item, out / item.name)
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    lines = ["inference_metadata_version: 1", f"model_file: {decoder['filename']}",
             f"max_sequence_length: {cfg['context_length']}", f"eos_token_ids: {eos}",
             f"head_size: {decoder['head_size']}",
             f"kv_num_heads: {decoder['num_key_value_heads']}",
             f"sliding_window: {window}", f"attention_sinks: {sinks}"]
    (out / "inference_metadata.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    top = rows.max(axis=-1, keepdims=True)
    return rows - top - np.log(np.exp(rows - top).sum(axis=-1, keepdims=True))


def run_arm(folder: Path, ids: list[int], threads: int) -> dict[str, Any]:
    from engine import Engine, EngineConfig

    engine = Engine.load(folder, EngineConfig(intra_op_threads=threads, prefix_cache=False))
    runner = engine.runner
    nll = np.zeros(len(ids) - 1)
    top = np.zeros(len(ids) - 1, dtype=np.int64)
    for start in range(0, len(ids) - 1, CHUNK):
        stop = min(start + CHUNK, len(ids) - 1)
        rows = _log_softmax(runner.forward(np.array(ids[start:stop], dtype=np.int64),
                                           all_logits=True))
        nll[start:stop] = -rows[np.arange(stop - start), ids[start + 1:stop + 1]]
        top[start:stop] = rows.argmax(axis=-1)
    token = int(ids[-1])
    times = []
    for _ in range(32):
        began = time.perf_counter()
        token = runner.forward_greedy(np.array([token], dtype=np.int64))
        times.append(time.perf_counter() - began)
    return {"nll": nll.tolist(), "top": top.tolist(), "decode_ms": 1000 * float(np.median(times)),
            "kv_rows": runner.kv_runner.length, "drops": getattr(runner, "drops", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=BUILTIN)
    ap.add_argument("--tokens", type=int, default=1536)
    ap.add_argument("--arms", default="full,256+4,256+0,512+4,512+0")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from engine.text.tokenizer import Tokenizer

    ids = Tokenizer.from_dir(args.model).encode(_text())[: args.tokens]
    arms: dict[str, Any] = {}
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:  # beside the model: hard links
        for arm in args.arms.split(","):
            if arm == "full":
                folder = args.model
            else:
                window, sinks = (int(x) for x in arm.split("+"))
                folder = windowed_folder(args.model, Path(tmp) / arm, window, sinks)
            arms[arm] = run_arm(folder, ids, args.threads)
            print(f"{arm}: done", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    full = arms.get("full")
    print(f"\n{len(ids)} tokens of held-out text ({', '.join(SOURCES)}), {args.model.name}\n")
    print("| arm | scored from | NLL (nats/token) | full's NLL there | top-1 = full's "
          "| KV rows held | decode ms/step at the end |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for arm, r in arms.items():
        start = 0 if arm == "full" else sum(int(x) for x in arm.split("+"))
        nll = np.array(r["nll"])[start:]
        row = [arm, str(start), f"{nll.mean():.3f}"]
        if full is not None:
            ref = np.array(full["nll"])[start:]
            same = np.array(r["top"])[start:] == np.array(full["top"])[start:]
            row += [f"{ref.mean():.3f}", f"{100 * same.mean():.1f}%"]
        else:
            row += ["", ""]
        row += [str(r["kv_rows"]), f"{r['decode_ms']:.2f}"]
        print("| " + " | ".join(row) + " |")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "window.json").write_text(json.dumps(
        {"model": str(args.model), "tokens": len(ids), "arms": {
            k: {kk: vv for kk, vv in v.items() if kk not in ("nll", "top")} |
            {"nll_mean": float(np.mean(v["nll"]))} for k, v in arms.items()}}, indent=1))


if __name__ == "__main__":
    main()
