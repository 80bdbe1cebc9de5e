"""16-bit KV: float16 or bfloat16? The range the KV needs, and greedy agreement with float32.

For each model and held-out prompt (this repository's own text, as ``bench.invariance``):

- ``range``: the largest |K| and |V| over every layer and position (the prompt and 48
  greedy tokens, float32 KV), against float16's largest finite value (65504), and the
  share of nonzero values below float16's smallest normal (2^-14, where it keeps fewer
  bits);
- ``fp16`` (when the engine's kernel has the float16-KV attention): the engine as it runs
  with ``kv_dtype="float16"``; ``int16`` the same with ``kv_dtype="int16"`` (whole numbers
  and a scale per token and KV head, the attention on the whole numbers: the default where
  the CPU has AVX-512 VNNI or AVX-VNNI); ``int8`` with ``kv_dtype="int8"`` (a scale per token and KV
  head);
- ``sim-fp16`` / ``sim-bf16``: float32 KV rounded in place to float16 / bfloat16 (to nearest,
  ties to even) after the prefill and after every step: a step's own new key is attended
  before it is rounded (the engine's float16 kernel rounds it first), so these two only
  compare the formats' precision with each other;
- ``sim-1ulp``: float32 KV moved one unit in the last place (towards +infinity) after every
  run: how far the model's answers move for the smallest change of its KV (the floor).

Each arm decodes 48 greedy tokens one step at a time and is compared with float32 KV: the
first differing token (``same`` when none), the largest log-probability difference of
the chosen tokens while the answers agree, and the largest difference of the prompt's last
logits (0 for the ``sim-*`` arms, which round the KV only after a run).

    .venv/bin/python -m bench.kv_dtype --model builtin=resources/models/smollm2-135m-instruct \\
        [--model NAME=DIR ...] [--new 48]

Writes bench/out/kv_dtype.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUT = REPO / "bench" / "out"
#: (file, first character, characters): held-out text the prompts are cut from.
SOURCES = (("engine/README.md", 0, 1400), ("engine/kv/reuse.py", 0, 1400),
           ("docs/models.md", 400, 1200), ("docs/kv-and-scheduling.md", 0, 1400),
           ("engine/kv/shift.py", 0, 1400))
FP16_MAX, FP16_MIN_NORMAL = 65504.0, 2.0 ** -14


def _prompts() -> list[str]:
    return [(REPO / f).read_text(encoding="utf-8")[start:start + n] for f, start, n in SOURCES]


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def next_up(x: np.ndarray) -> np.ndarray:
    return np.nextafter(x, np.float32(np.inf))


def to_fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64).ravel()
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


Run = tuple[list[int], list[float], np.ndarray]


def greedy(engine: Any, ids: list[int], new: int,
           rounding: Callable[[np.ndarray], np.ndarray] | None = None) -> Run:
    """`new` greedy tokens after `ids`, one step at a time, their log-probabilities and the
    prompt's last logits; the KV rounded by `rounding` after each run (None: as the engine
    keeps it)."""
    runner = engine.runner
    runner.reset()

    def run(tokens: list[int]) -> np.ndarray:
        logits = np.array(runner.forward(np.array(tokens, dtype=np.int64)), dtype=np.float32)
        if rounding is not None:
            for view in runner._kv_views():
                view[:, :runner.length] = rounding(view[:, :runner.length])
        return logits.reshape(-1, logits.shape[-1])[-1]

    logits = run(ids)
    prompt = logits.copy()
    tokens, logprobs = [], []
    for _ in range(new):
        token = int(logits.argmax())
        tokens.append(token)
        logprobs.append(float(_log_softmax(logits)[token]))
        logits = run([token])
    return tokens, logprobs, prompt


def kv_range(engine: Any) -> dict[str, float]:
    """The largest |K| and |V| the runner holds, and the share of tiny nonzero values."""
    runner = engine.runner
    pairs = engine.spec.kv_pairs
    rows = runner.export_kv(0, runner.length)
    out: dict[str, float] = {}
    for kind in ("key", "value"):
        values = np.concatenate([np.abs(r.astype(np.float32)).ravel()
                                 for r, p in zip(rows, pairs, strict=True) if p.kind == kind])
        nonzero = values[values > 0]
        out[f"max_{kind}"] = float(values.max())
        out[f"tiny_{kind}"] = float((nonzero < FP16_MIN_NORMAL).mean()) if nonzero.size else 0.0
    return out


def compare(ref: Run, got: Run) -> dict[str, Any]:
    first = next((i for i, (a, b) in enumerate(zip(ref[0], got[0], strict=True)) if a != b),
                 None)
    upto = len(ref[0]) if first is None else first
    drift = max((abs(a - b) for a, b in zip(ref[1][:upto], got[1][:upto], strict=True)),
                default=0.0)
    return {"first_diff": first, "logprob_drift": drift,
            "prompt_logits_diff": float(np.abs(ref[2] - got[2]).max())}


def _kept(folder: str, dtype: str) -> Any:
    """The model at `folder` with `dtype` KV, or None where the engine cannot keep it."""
    from engine import Engine, EngineConfig
    from engine.errors import InvalidOptionError

    try:
        return Engine.load(folder, EngineConfig(intra_op_threads=2, kv_dtype=dtype))
    except InvalidOptionError as exc:
        print(f"{folder}: no {dtype} arm: {exc}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    from engine import Engine, EngineConfig, GenerateRequest, kernels

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--new", type=int, default=48)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {}
    for spec in args.model:
        name, _, folder = spec.partition("=")
        full = Engine.load(folder, EngineConfig(intra_op_threads=2, kv_dtype="float32"))

        half = _kept(folder, "float16") if kernels.f16kv_ready() else None
        small = _kept(folder, "int8") if half is not None and kernels.i8kv_ready() else None
        whole = _kept(folder, "int16") if half is not None and kernels.i16kv_ready() else None
        rows = []
        for prompt in _prompts():
            ids = full.encode_request(GenerateRequest(prompt=prompt))
            ref = greedy(full, ids, args.new)
            row: dict[str, Any] = {"prompt_tokens": len(ids), **kv_range(full)}
            arms: dict[str, tuple[Any, Callable[[np.ndarray], np.ndarray] | None]] = {
                "sim-fp16": (full, to_fp16), "sim-bf16": (full, to_bf16),
                "sim-1ulp": (full, next_up)}
            if half is not None:
                arms = {"fp16": (half, None), **arms}
            if whole is not None:
                arms = {"int16": (whole, None), **arms}
            if small is not None:
                arms = {"int8": (small, None), **arms}
            for arm, (engine, rounding) in arms.items():
                row[arm] = compare(ref, greedy(engine, ids, args.new, rounding))
            rows.append(row)
            print(name, json.dumps(row), flush=True)
        report[name] = rows
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "kv_dtype.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    for name, rows in report.items():
        print(f"\n{name}: max |K| {max(r['max_key'] for r in rows):.1f}, max |V| "
              f"{max(r['max_value'] for r in rows):.2f} (float16 max {FP16_MAX:.0f})")
        for arm in ("int8", "int16", "fp16", "sim-fp16", "sim-bf16", "sim-1ulp"):
            if arm in rows[0]:
                cells = [str(r[arm]["first_diff"] if r[arm]["first_diff"] is not None
                             else "same") for r in rows]
                drift = max(r[arm]["logprob_drift"] for r in rows)
                moved = ", ".join(f"{r[arm]['prompt_logits_diff']:.3f}" for r in rows)
                print(f"  {arm:9s} first differing token: {', '.join(cells)}; "
                      f"largest log-probability drift before it {drift:.2e}; the prompt's "
                      f"last logits moved {moved}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
