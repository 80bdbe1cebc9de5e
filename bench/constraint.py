"""The JSON constraint at a 32k vocabulary: its cost per token, and that outputs parse.

Uses the forge's 32k tokenizer (the bench model's, else trained once with
``make_tokenizer_files(dir, 32000)``). Sampled generations run the real processor
(``TokenConstraint.apply``: sync + mask + -inf) on synthetic logits: normal noise plus a
bias toward tokens holding JSON punctuation, so values end within a few hundred tokens
while their strings still span many tokens. Every output must parse (``json_object``) or
validate against its schema (jsonschema_rs). Per-token costs are split into cold steps
(the state's mask was not cached) and warm ones; building the per-tokenizer index is a
one-time cost reported on its own.

``--engine N`` also decodes N seeded requests on the bench model (int4) with and without
``json_object`` and compares ms per token (the model dominates; the difference is the
constraint's share).

    python -m bench.constraint [--generations 200] [--engine 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
MODEL = OUT / "models" / "genai-L12-H768-A12-KV4-I2048-V32000-fp32"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "admin": {"type": "boolean"},
        "role": {"enum": ["owner", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {
            "city": {"type": "string"}, "zip": {"type": ["string", "null"]}},
            "required": ["city"]},
    },
    "required": ["name", "age", "role"],
}


def _tokenizer_dir() -> Path:
    if (MODEL / "tokenizer.json").is_file():
        return MODEL
    from tests.forge import make_tokenizer_files

    return make_tokenizer_files(Path(tempfile.mkdtemp(prefix="bench-constraint-")), 32000)


def _stats(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    a = np.asarray(ms)
    return {"n": int(a.size), "mean_ms": round(float(a.mean()), 4),
            "p50_ms": round(float(np.median(a)), 4),
            "p99_ms": round(float(np.percentile(a, 99)), 4), "max_ms": round(float(a.max()), 3)}


def sampled_runs(generations: int, kind: str, max_tokens: int = 600) -> dict[str, Any]:
    import jsonschema_rs

    from engine.config import JsonConstraintSpec
    from engine.constraint import TokenConstraint
    from engine.constraint_index import grammar_for, index_for
    from engine.json_schema import compile_spec
    from engine.logits import ProcessorContext
    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(_tokenizer_dir())
    t0 = time.perf_counter()
    texts = tokenizer.token_texts()
    texts_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    end = tuple(tokenizer.eos_token_ids)
    index_for(texts, frozenset(tokenizer.special_token_ids) | frozenset(end))
    index_s = time.perf_counter() - t0
    spec = JsonConstraintSpec("json_schema", SCHEMA) if kind == "json_schema" else \
        JsonConstraintSpec("json_object", object_only=True)
    grammar = grammar_for(compile_spec(spec))
    punct = np.array([any(c in t for c in '"{}[],:') for t in texts], dtype=np.float32)
    rng = np.random.default_rng(0)
    cold: list[float] = []
    warm: list[float] = []
    ok = 0
    failures: list[str] = []
    for _ in range(generations):
        constraint = TokenConstraint(spec, texts, end_ids=end,
                                     banned_ids=tokenizer.special_token_ids)
        context = ProcessorContext(prompt_ids=[1])
        for _ in range(max_tokens):
            logits = rng.normal(0.0, 2.0, len(texts)).astype(np.float32) + 6.0 * punct
            misses = grammar.misses
            t0 = time.perf_counter()
            out = constraint.apply(logits, context)
            spent = (time.perf_counter() - t0) * 1e3
            (warm if grammar.misses == misses else cold).append(spent)
            weights = np.exp(out - out.max())
            token = int(rng.choice(len(out), p=weights / weights.sum()))
            context.append(token)
            constraint.sync(context.generated_ids)
            if constraint.closed:
                break
        text = "".join(texts[t] for t in context.generated_ids if t not in end)
        try:
            value = json.loads(text)
            if kind == "json_schema":
                jsonschema_rs.validate(SCHEMA, value)
            ok += 1
        except (ValueError, jsonschema_rs.ValidationError) as exc:
            failures.append(f"{exc}: {text[:120]!r}")
    return {"kind": kind, "vocab": len(texts), "token_texts_s": round(texts_s, 3),
            "index_build_s": round(index_s, 3), "generations": generations, "valid": ok,
            "failures": failures[:5], "per_token_all": _stats(cold + warm),
            "per_token_warm": _stats(warm), "per_token_cold": _stats(cold)}


def engine_runs(requests: int, new_tokens: int = 64) -> dict[str, Any]:
    from bench.decode import build_models
    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
    from engine.config import JsonConstraintSpec
    from engine.errors import ConstraintError

    model = build_models(OUT, ["int4"])["int4"]
    engine = Engine.load(model, EngineConfig(intra_op_threads=2))
    arms: dict[str, list[float]] = {"plain": [], "json_object": []}
    errors = 0
    for seed in range(requests):
        for arm in arms:
            options = GenerateOptions(
                max_new_tokens=new_tokens, seed=seed, stop_on_eos=False,
                constraint=JsonConstraintSpec(object_only=True) if arm != "plain" else None)
            stamps: list[float] = []
            try:
                for event in engine.stream(GenerateRequest(prompt="Answer in JSON:",
                                                           options=options)):
                    if event.token_id is not None:
                        stamps.append(event.timestamp)
            except ConstraintError:
                errors += 1
            if len(stamps) > 2:
                arms[arm].append((stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1))
    return {"requests": requests, "incomplete_errors": errors,
            **{f"{arm}_ms_per_token": round(float(np.median(v)), 3) for arm, v in arms.items()
               if v}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", type=int, default=200)
    ap.add_argument("--engine", type=int, default=0, help="seeded requests on the bench model")
    args = ap.parse_args(argv)
    summary: dict[str, Any] = {
        kind: sampled_runs(args.generations, kind) for kind in ("json_object", "json_schema")}
    if args.engine:
        summary["engine"] = engine_runs(args.engine)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "constraint.json").write_text(json.dumps(summary, indent=1))
    json.dump(summary, sys.stdout, indent=1)
    print()
    return 0 if all(summary[k]["valid"] == args.generations
                    for k in ("json_object", "json_schema")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
