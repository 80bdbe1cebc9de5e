"""Five catalog entries, small to 7B, on this machine: their fit label and expected decode
speed; and for those up to 1.5B a model of the same shapes with random weights, exported
with onnxruntime-genai's builder (int4, CPU), served by the Hub stand-in on 127.0.0.1 under
the entry's repository, pulled with ``python -m engine pull NAME`` (``HF_ENDPOINT`` at the
stand-in), loaded as the worker loads it and decoded: what the governor did and the speed
measured beside the expected one.

    python3 -m venv /tmp/exportvenv
    /tmp/exportvenv/bin/pip install torch==2.13.0 transformers onnx-ir onnxruntime-genai onnxruntime
    .venv/bin/python -m bench.catalog_table --models /tmp/catalog_models \\
        --export-python /tmp/exportvenv/bin/python [--runs 3] [--tokens 128]

``--models`` keeps the exports (``repos/NAME/cpu-int4``, 0.3-1.3 GB each; exported once,
``bench/_random_export.py``) and the library they are pulled into (``library/``, emptied
first). The shapes are the models' public ``config.json`` ones (:data:`SHAPES`); the
tokenizer is the built-in model's (49,152 tokens; the embedding keeps the model's
vocabulary size). The 7B entry is not exported (its fp32 weights do not fit in this
machine's memory): its repository holds the 1.5B export's files with the 7B shape in
``genai_config.json`` and a sparse ``model.onnx.data`` of the size the builder's int4
export of that shape has (:func:`int4_export_bytes`, checked against the four real
exports); it is labelled from the listing and never downloaded.

Writes ``bench/out/catalog-table.json`` and prints a Markdown table. The labels and expected
speeds are the catalog's (its figures measured as it does, once: :mod:`engine.hub.bandwidth`),
made at the start. Each model then decodes ``--runs`` greedy ``--tokens``-token answers, each
right after a round of the figures' measurement (:class:`engine.hub.bandwidth.Probe`), and
the expected speed from that round's figures is set beside the speed measured then
("paired"): on a shared machine the load changes from one minute to the next, so this tells
the estimate's own error apart from the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.errors import EngineError
from engine.hub.bandwidth import Probe, ReadSpeed
from engine.hub.browse import billions, catalog_rows
from engine.hub.catalog import CatalogEntry, load_catalog
from engine.hub.fit import SPEED_CONTEXT
from engine.hub.pull import pulled_context
from tests.app.hub_standin import HubStandin

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "resources" / "models" / "smollm2-135m-instruct"
_COMMON = dict(hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
               max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, pad_token_id=2)
#: The public config.json shapes; token ids are the built-in tokenizer's (1 / 2).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-coder-0.5b": dict(
        _COMMON, model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=896,
        intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-0.6b": dict(
        _COMMON, model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=1024,
        intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=40960, tie_word_embeddings=True),
    "llama-3.2-1b-instruct": dict(
        _COMMON, model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        tie_word_embeddings=True),
    "qwen2.5-coder-1.5b": dict(
        _COMMON, model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=1536,
        intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-coder-7b": dict(
        _COMMON, model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=3584,
        intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
EXPORTED = ("qwen2.5-coder-0.5b", "qwen3-0.6b", "llama-3.2-1b-instruct", "qwen2.5-coder-1.5b")
LISTED_ONLY = "qwen2.5-coder-7b"
FOLDER = "cpu-int4"  # the builder's int4 CPU export, as the Hub's ONNX repos name theirs


def _int4(n: int, k: int) -> int:
    """A [k -> n] MatMulNBits weight of the builder (4 bits, block 32, fp32 scales)."""
    blocks = -(-k // 32)
    return n * blocks * 16 + n * blocks * 4


def int4_export_bytes(shape: dict[str, Any]) -> int:
    """The bytes of ``model.onnx.data`` of the builder's int4 CPU export of ``shape``:
    every projection in MatMulNBits (q, k, v in one), fp32 norms and biases, the rotary
    cos/sin tables of the whole context, the LM head in int4 (a tied embedding gathers
    from it; an untied one is kept apart in fp32). Checked against the four exports here:
    exact but for Qwen2's q/k/v biases, which the builder leaves out when they are zero
    (random weights; a trained model has them)."""
    hidden, layers = shape["hidden_size"], shape["num_hidden_layers"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    head = shape.get("head_dim") or hidden // heads
    ffn, vocab = shape["intermediate_size"], shape["vocab_size"]
    qkv = (heads + 2 * kv) * head
    layer = (_int4(qkv, hidden) + _int4(hidden, heads * head) + 2 * _int4(ffn, hidden)
             + _int4(hidden, ffn) + 2 * hidden * 4)
    if shape["model_type"] == "qwen2":
        layer += qkv * 4  # q, k, v biases
    if shape["model_type"] == "qwen3":
        layer += 2 * head * 4  # q and k norms
    head_bytes = _int4(vocab, hidden) + (0 if shape.get("tie_word_embeddings")
                                         else vocab * hidden * 4)
    rotary = 2 * shape["max_position_embeddings"] * (head // 2) * 4
    return layers * layer + hidden * 4 + head_bytes + rotary


def export(models: Path, python: str) -> None:
    (models / "shapes").mkdir(parents=True, exist_ok=True)
    for name in EXPORTED:
        out = models / "repos" / name / FOLDER
        if (out / "genai_config.json").is_file():
            continue
        shape = models / "shapes" / f"{name}.json"
        shape.write_text(json.dumps(SHAPES[name], indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"exporting {name} (random weights, int4 CPU)...", flush=True)
        subprocess.run([python, str(ROOT / "bench" / "_random_export.py"), str(shape),
                        str(TOKENIZER), str(out)], check=True, stdout=subprocess.DEVNULL)


def listed_only(models: Path) -> Path:
    """The 7B entry's repository: the 1.5B export's files, the 7B shape, sparse weights."""
    source = models / "repos" / "qwen2.5-coder-1.5b" / FOLDER
    out = models / "repos" / LISTED_ONLY / FOLDER
    shutil.rmtree(out.parent, ignore_errors=True)
    out.mkdir(parents=True)
    for f in source.iterdir():
        if f.name != "model.onnx.data":
            shutil.copy2(f, out / f.name)
    shape = SHAPES[LISTED_ONLY]
    genai = json.loads((source / "genai_config.json").read_text())
    dec = genai["model"]["decoder"]
    dec.update(hidden_size=shape["hidden_size"], num_hidden_layers=shape["num_hidden_layers"],
               num_attention_heads=shape["num_attention_heads"],
               num_key_value_heads=shape["num_key_value_heads"],
               head_size=shape["hidden_size"] // shape["num_attention_heads"])
    genai["model"].update(vocab_size=shape["vocab_size"],
                          context_length=shape["max_position_embeddings"])
    (out / "genai_config.json").write_text(json.dumps(genai, indent=4))
    with open(out / "model.onnx.data", "wb") as data:  # sparse: listed, never downloaded
        data.truncate(int4_export_bytes(shape))
    return out.parent


def figures(speed: ReadSpeed) -> dict[str, float]:
    return {"fp32_gb_s": round(speed.bytes_per_second / 1e9, 2),
            "int4_gb_s": round((speed.int4_bytes_per_second or 0) / 1e9, 2),
            "layer_us": round(speed.layer_seconds * 1e6, 1)}


def decode(folder: Path, expect: Callable[[ReadSpeed], float | None], probe: Probe,
           runs: int, tokens: int, old_read: int) -> dict[str, Any]:
    """Load ``folder`` as the worker does (its pull.json context) and decode ``runs``
    times, each right after a round of the probe: the expected speed from that round's
    figures beside the speed measured then; and the estimate before the per-layer cost
    (``old``: the built-in model's speed times its bytes over ``old_read``, the model's
    weights and 512 tokens of KV: the share of the fp32 rate it gets, applied to this
    model) from the same round."""
    context = pulled_context(folder)
    try:
        engine = Engine.load(folder, EngineConfig(kv_max_len=context))
    except EngineError as exc:
        return {"loaded": False, "refusal": str(exc)}
    try:
        engine.wait_huge_pages(timeout=30)
        info = engine.describe()
        speeds, paired = [], []
        for seed in range(runs):
            fp32, int4, probe_tokens = probe.round()
            now = probe.speed(fp32, int4, probe_tokens)
            old = probe_tokens * (probe.read + probe.rotary) / old_read
            result = engine.generate(GenerateRequest(
                prompt=f"Write a story number {seed}.", options=GenerateOptions(
                    max_new_tokens=tokens, temperature=0.0, stop_on_eos=False,
                    speculative_mode="none")))  # a decode step's speed, not lookup's
            measured = round(result.timings.decode_tok_s or 0.0, 2)
            speeds.append(measured)
            paired.append({**figures(now), "probe_tok_s": round(probe_tokens, 2),
                           "expected": expect(now), "old_expected": round(old, 2),
                           "measured": measured})
    finally:
        engine.close()
    return {"loaded": True, "context": info["context_length"], "threads": info["threads"],
            "speeds": speeds, "measured": max(speeds), "paired": paired}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.catalog_table",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path("/tmp/catalog_models"))
    parser.add_argument("--export-python", default="/tmp/exportvenv/bin/python",
                        help="a Python with torch, transformers, onnxruntime-genai")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "catalog-table.json")
    args = parser.parse_args()
    models = args.models.resolve()
    export(models, args.export_python)
    for name in EXPORTED:
        data = models / "repos" / name / FOLDER / "model.onnx.data"
        print(f"{name}: model.onnx.data {data.stat().st_size:,} bytes, predicted "
              f"{int4_export_bytes(SHAPES[name]):,}")
    listed_only(models)
    wanted = (*EXPORTED, LISTED_ONLY)
    entries = tuple(sorted((e for e in load_catalog() if e.name in wanted),
                           key=lambda e: billions(e.parameters)))
    library = models / "library"
    shutil.rmtree(library, ignore_errors=True)
    library.mkdir()
    rows: list[dict[str, Any]] = []
    with HubStandin({e.repo: models / "repos" / e.name for e in entries}) as hub, \
            Probe() as probe:
        found = [probe.round() for _ in range(3)]  # as the catalog measures it once
        speed = probe.speed(*(max(r[i] for r in found) for i in range(3)))
        print(f"figures when labelled: {figures(speed)}", flush=True)

        def expect(entry: CatalogEntry, figures: ReadSpeed) -> float | None:
            [row] = catalog_rows(endpoint=hub.url, bandwidth=figures, entries=(entry,))
            return row.choice.fit.tokens_per_second if row.choice else None

        for row in catalog_rows(endpoint=hub.url, config=EngineConfig(), bandwidth=speed,
                                entries=entries):
            if row.choice is None:
                raise SystemExit(f"{row.entry.name}: {row.problem}")
            fit = row.choice.fit
            record: dict[str, Any] = {
                "name": row.entry.name, "repo": row.entry.repo,
                "parameters": row.entry.parameters, "label": fit.text,
                "weights_bytes": fit.weights_bytes, "expected": fit.tokens_per_second,
                "read_speed": figures(speed), "details": fit.details()}
            if row.entry.name in EXPORTED:
                env = {**os.environ, "HF_ENDPOINT": hub.url, "PYTHONPATH": str(ROOT)}
                start = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "engine", "pull", row.entry.name,
                                       "--models-dir", str(library), "--quiet"], env=env,
                                      capture_output=True, text=True)
                record["pull"] = (done.stdout or done.stderr).strip()
                record["pull_s"] = round(time.perf_counter() - start, 1)
                if done.returncode == 0:
                    folder = Path(done.stdout.strip().rsplit(": ", 1)[1])  # "ready: DIR"
                    record["folder"] = folder.name
                    old_read = fit.weights_bytes + fit.kv_bytes_per_token * min(
                        fit.context, SPEED_CONTEXT)
                    record.update(decode(folder, partial(expect, row.entry), probe,
                                         args.runs, args.tokens, old_read))
            rows.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "details"}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows},
                                   indent=1) + "\n")
    print(table(rows))
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| entry | params | label here | expected tok/s | pulled (random weights) | "
             "governor | context | measured tok/s (runs) | measured / expected | "
             "paired: measured / expected that moment | the same, estimate before |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "pull" not in r:
            lines.append(f"| {r['name']} | {r['parameters']} | {r['label']} | "
                         f"{r['expected']} | not exported (listed only) | — | — | — | — | — | — |")
            continue
        governor = "loaded" if r.get("loaded") else f"refused: {r.get('refusal', r['pull'])}"
        runs = ", ".join(f"{s:.1f}" for s in r.get("speeds", []))
        ratio = (f"{r['measured'] / r['expected']:.2f}" if r.get("measured")
                 and r.get("expected") else "—")
        paired = ", ".join(f"{p['measured'] / p['expected']:.2f}" for p in r.get("paired", [])
                           if p["expected"]) or "—"
        before = ", ".join(f"{p['measured'] / p['old_expected']:.2f}"
                           for p in r.get("paired", []) if p["old_expected"]) or "—"
        lines.append(f"| {r['name']} | {r['parameters']} | {r['label']} | {r['expected']} | "
                     f"{r['weights_bytes'] / 2**20:.0f} MiB | {governor} | "
                     f"{r.get('context', '—')} | {r.get('measured', '—')} ({runs}) | {ratio} | "
                     f"{paired} | {before} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
