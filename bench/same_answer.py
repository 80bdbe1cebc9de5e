"""Same answer whatever the path: the invariance matrix (paths x models x kernels).

    .venv/bin/python -m bench.same_answer

For each model and each kernel choice (the engine's kernels; ONNX Runtime's MatMulNBits
with ONNX_GENAI_MATMUL=0; ONNX Runtime's kernels throughout with ONNX_GENAI_KERNELS=0),
each in a fresh process:

- ``repeat``: a greedy request of 24 tokens, then the same request again (its prompt KV
  comes from the prefix cache, so the last prompt token runs as a one-row step): the same
  tokens and log-probabilities, or the first token that differs;
- ``chunks 1 / 7 / 64``: a 150-token prompt prefilled in chunks of that size against all
  at once: the same last-row logits, or their largest difference.

Models: the built-in one (the builder's int4, blocks of 32, accuracy 4); forged int4 exports
in blocks of 32 and 128 at accuracy 4 and 0 (tests.forge, random weights) and their fp32
source; GGUF imports of tiny random Q4_0 / Q4_1 / Q4_K / Q8_0 files
(tests.engine.model.gguf_forge) with ``--compute int8`` and ``fp32``. ``bench.invariance``
runs real model folders along every path (batches and speculation too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

KERNELS = {"engine": {}, "ort-matmul": {"ONNX_GENAI_MATMUL": "0"},
           "ort": {"ONNX_GENAI_KERNELS": "0"}}
PATHS = ("repeat", "chunks 1", "chunks 7", "chunks 64")


def make_models(root: Path) -> dict[str, Path]:
    from gguf import GGMLQuantizationType as QT

    from engine.model.default_model import default_model_dir
    from engine.model.gguf import import_gguf
    from tests.conftest import INT4_SPEC
    from tests.engine.model.gguf_forge import TinySpec, tokenizer_source, write_gguf
    from tests.forge import quantize_int4, write_genai_model

    models: dict[str, Path] = {}
    builtin = default_model_dir()
    if builtin is not None:
        models["built-in (int4 b32 acc4)"] = builtin
    fp32 = write_genai_model(root / "fp32", INT4_SPEC)
    models["forged fp32"] = fp32
    for block in (32, 128):
        for accuracy in (4, 0):
            models[f"forged int4 b{block} acc{accuracy}"] = quantize_int4(
                fp32, root / f"int4-{block}-{accuracy}", block_size=block,
                accuracy_level=accuracy)
    tok = tokenizer_source(root)
    for name, kind, extra in (("Q4_0", QT.Q4_0, {}), ("Q4_1", QT.Q4_1, {}),
                              ("Q4_K", QT.Q4_K, {"hidden": 256, "head_dim": 64, "ffn": 256}),
                              ("Q8_0", QT.Q8_0, {})):
        path = root / f"{name}.gguf"
        write_gguf(path, TinySpec("llama", kind, context=512, **extra), tok)  # type: ignore[arg-type]
        for compute in ("int8", "fp32"):
            out = root / f"{name}-{compute}"
            import_gguf(path, out, compute=compute)
            models[f"GGUF {name} --compute {compute}"] = out
    return models


def worker(model: Path) -> dict[str, str]:
    import numpy as np

    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest

    engine = Engine.load(model, EngineConfig(intra_op_threads=2))
    vocab = engine.spec.vocab_size
    rng = np.random.default_rng(0)
    result: dict[str, str] = {"kernels": engine.kernel_use.line() if engine.kernel_use else ""}
    prompt = tuple(int(t) for t in rng.integers(3, vocab - 1, size=40))
    request = GenerateRequest(token_ids=prompt, options=GenerateOptions(
        max_new_tokens=24, temperature=0.0, stop_on_eos=False, top_logprobs=1))
    first, again = engine.generate(request), engine.generate(request)
    a, b = list(first.token_ids), list(again.token_ids)
    la, lb = [t.logprob for t in first.logprobs], [t.logprob for t in again.logprobs]
    if a != b:
        at = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        result["repeat"] = f"token {at}"
    elif la != lb:
        at = next(i for i, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y)
        result["repeat"] = f"logprob {at}"
    else:
        result["repeat"] = "identical" + ("" if again.prefix_cache_hit_len else " (no reuse)")
    ids = rng.integers(3, vocab - 1, size=150).astype(np.int64)
    last = {}
    for chunk in (1, 7, 64, len(ids)):
        engine.runner.reset()
        for start in range(0, len(ids), chunk):
            logits = engine.runner.forward(ids[start:start + chunk])
        last[chunk] = logits.copy()
    for chunk in (1, 7, 64):
        diff = float(np.abs(last[chunk] - last[len(ids)]).max())
        result[f"chunks {chunk}"] = "identical" if diff == 0 else f"{diff:.2g} apart"
    engine.close()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(Path(args.worker))))
        return 0
    table: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = make_models(Path(tmp))
        for name, path in models.items():
            for kernels, env in KERNELS.items():
                done = subprocess.run(
                    [sys.executable, "-m", "bench.same_answer", "--worker", str(path)],
                    cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env},
                    capture_output=True, text=True, check=False)
                if done.returncode:
                    row = {"error": done.stderr.strip().splitlines()[-1]}
                else:
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                table[f"{name} | {kernels}"] = row
                cells = " | ".join(f"{k}: {row.get(k, row.get('error'))}" for k in PATHS)
                print(f"{name:30} {kernels:10} {cells}", flush=True)
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "same_answer.json").write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
