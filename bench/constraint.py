"""Structured output on llguidance: compile time, mask time per token, and tok/s with and
without a schema (bench/constraint.md has the figures).

Two vocabularies:

- ``builtin``: the tokenizer of ``--model`` (default: the built-in model,
  ``engine.model.default_model``);
- ``150k``: that tokenizer's ``tokenizer.json`` grown to 150,000 ids (Qwen2.5/Llama-3
  size) with tokens made of two existing ones (byte-level, so llguidance sees real byte
  strings); its merges are the original ones, which is all a mask needs.

For each: llguidance's tokenizer set-up, then per schema (a 7-field object; the OpenAI
SDK's Pydantic schema with ``$defs``/``$ref``, ``anyOf``, bounds, a pattern and non-ASCII
enum values) the grammar compile time (``TokenConstraint`` construction) and the mask time
of every token of sampled runs (``TokenConstraint.apply``: sync, mask, -inf) on synthetic
logits (noise plus a bias toward JSON punctuation, so values close within a few hundred
tokens). Every output must validate (``jsonschema``) or end on the token budget.

``--engine N`` decodes N seeded requests on ``--model`` at temperature 1.0 with and
without the Pydantic schema and reports tok/s and ms per token of each, and the constraint
processor's own time per token (the arms' difference also holds run-to-run noise and
different tokens: a constrained answer is another text).

    python -m bench.constraint [--model DIR] [--generations 30] [--engine 8]
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
PEOPLE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
        "score": {"type": "number"}, "admin": {"type": "boolean"},
        "role": {"enum": ["owner", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                 "maxItems": 4},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20}, "zip": {"type": ["string", "null"]}},
            "required": ["city"]}},
    "required": ["name", "age", "role"]}


def pydantic_schema() -> dict[str, Any]:
    """What ``client.chat.completions.parse(response_format=Trip)`` sends."""
    from typing import Literal

    import pydantic
    from openai.lib._pydantic import to_strict_json_schema

    class Place(pydantic.BaseModel):
        city: Literal["Zürich", "東京", "Kraków"]
        population: int = pydantic.Field(ge=0, le=50_000_000)
        code: str = pydantic.Field(pattern=r"^[A-Z]{3}$")

    class Trip(pydantic.BaseModel):
        stops: list[Place] = pydantic.Field(max_length=3)
        note: str | None = pydantic.Field(max_length=40)

    return to_strict_json_schema(Trip)


def widened(source: Path, size: int, seed: int = 0) -> Path:
    """A copy of ``source``'s tokenizer folder whose vocabulary has ``size`` ids."""
    data = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = data["model"]["vocab"]
    taken = set(vocab)
    pieces = [t for t in vocab if t.isprintable() and len(t) > 1]
    rng = np.random.default_rng(seed)
    next_id = max(max(vocab.values()), *(t["id"] for t in data.get("added_tokens", []))) + 1
    while next_id < size:
        a, b = rng.choice(len(pieces), 2)
        token = pieces[a] + pieces[b].lstrip("Ġ▁")
        if token not in taken:
            taken.add(token)
            vocab[token] = next_id
            next_id += 1
    out = Path(tempfile.mkdtemp(prefix=f"bench-vocab-{size}-"))
    (out / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            (out / name).write_bytes((source / name).read_bytes())
    return out


def _stats(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {"n": 0}
    ms = np.asarray(seconds) * 1e3
    return {"n": int(ms.size), "p50_ms": round(float(np.median(ms)), 4),
            "p99_ms": round(float(np.percentile(ms, 99)), 4),
            "mean_ms": round(float(ms.mean()), 4), "max_ms": round(float(ms.max()), 3)}


def sampled_runs(folder: Path, schemas: dict[str, dict[str, Any]], generations: int,
                 max_tokens: int = 400) -> dict[str, Any]:
    import jsonschema

    import engine.generation.guidance as guidance
    from engine.config import ConstraintSpec
    from engine.generation.logits import ProcessorContext
    from engine.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(folder)
    vocab = tokenizer.vocab_size
    started = time.perf_counter()
    guidance.guidance_tokenizer(tokenizer, vocab)
    setup_s = time.perf_counter() - started
    texts = tokenizer.token_texts()
    punct = np.array([any(c in t for c in '"{}[],:') for t in texts], dtype=np.float32)
    end = tuple(tokenizer.eos_token_ids)
    report: dict[str, Any] = {"vocab": vocab, "tokenizer_setup_s": round(setup_s, 3)}
    rng = np.random.default_rng(0)
    for name, body in schemas.items():
        spec = ConstraintSpec("json_schema", body)
        compile_s: list[float] = []
        mask_s: list[float] = []
        apply_s: list[float] = []
        valid = cut = 0
        failures: list[str] = []
        for _ in range(generations):
            constraint = guidance.TokenConstraint(spec, tokenizer, vocab, end_ids=end,
                                                  banned_ids=tokenizer.special_token_ids)
            compile_s.append(constraint.compile_s)
            context = ProcessorContext(prompt_ids=[1])
            for _ in range(max_tokens):
                logits = rng.normal(0.0, 2.0, vocab).astype(np.float32) + 5.0 * punct
                t0 = time.perf_counter()
                out = constraint.apply(logits, context)
                apply_s.append(time.perf_counter() - t0)
                weights = np.exp(out - out.max())
                context.append(int(rng.choice(vocab, p=weights / weights.sum())))
                constraint.sync(context.generated_ids)
                if constraint.closed:
                    break
            mask_s += constraint.mask_s
            ids = [t for t in context.generated_ids if t not in end]
            text = tokenizer.decode(ids)
            if not constraint.closed:
                cut += 1
                continue
            try:
                jsonschema.validate(json.loads(text), body)
                valid += 1
            except (ValueError, jsonschema.ValidationError) as exc:
                failures.append(f"{exc.__class__.__name__}: {text[:120]!r}")
        report[name] = {"generations": generations, "valid": valid, "cut_by_budget": cut,
                        "failures": failures[:3], "compile": _stats(compile_s),
                        "mask": _stats(mask_s), "processor": _stats(apply_s)}
    return report


def engine_runs(folder: Path, requests: int, new_tokens: int = 96) -> dict[str, Any]:
    from engine import ConstraintSpec, Engine, EngineConfig, GenerateOptions, GenerateRequest
    from engine.generation.guidance import TokenConstraint

    spent: list[float] = []  # the constraint processor's own time, every token
    original = TokenConstraint.apply

    def timed(self: TokenConstraint, logits: Any, context: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(self, logits, context)
        finally:
            spent.append(time.perf_counter() - t0)

    TokenConstraint.apply = timed  # type: ignore[method-assign]
    engine = Engine.load(folder, EngineConfig(intra_op_threads=2))
    spec = ConstraintSpec("json_schema", pydantic_schema())
    arms: dict[str, list[float]] = {"plain": [], "schema": []}
    for seed in range(requests):
        for arm in arms:
            options = GenerateOptions(max_new_tokens=new_tokens, seed=seed, temperature=1.0,
                                      stop_on_eos=arm == "schema",
                                      constraint=spec if arm == "schema" else None)
            stamps = [e.timestamp for e in engine.stream(GenerateRequest(
                prompt="Plan a trip. Answer in JSON:", options=options))
                if e.token_id is not None]
            if len(stamps) > 2:
                arms[arm].append((stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1))
    report: dict[str, Any] = {"requests": requests, "model": str(folder)}
    for arm, values in arms.items():
        ms = float(np.median(values))
        report[f"{arm}_ms_per_token"] = round(ms, 3)
        report[f"{arm}_tok_s"] = round(1e3 / ms, 1)
    report["overhead_ms_per_token"] = round(report["schema_ms_per_token"]
                                            - report["plain_ms_per_token"], 3)
    report["constraint_processor"] = _stats(spent)
    TokenConstraint.apply = original  # type: ignore[method-assign]
    return report


def main(argv: list[str] | None = None) -> int:
    from engine.model.default_model import default_model_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=default_model_dir(),
                    help="model folder (default: the built-in model)")
    ap.add_argument("--generations", type=int, default=30)
    ap.add_argument("--engine", type=int, default=0, help="seeded requests on --model")
    args = ap.parse_args(argv)
    if args.model is None:
        ap.error("the built-in model is not in this checkout: pass --model DIR")
    schemas = {"people": PEOPLE, "pydantic_trip": pydantic_schema()}
    summary: dict[str, Any] = {
        "builtin": sampled_runs(args.model, schemas, args.generations),
        "150k": sampled_runs(widened(args.model, 150_000), schemas, args.generations)}
    if args.engine:
        summary["engine"] = engine_runs(args.model, args.engine)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "constraint.json").write_text(json.dumps(summary, indent=1))
    json.dump(summary, sys.stdout, indent=1)
    print()
    bad = [(vocab, name) for vocab in ("builtin", "150k") for name in schemas
           if summary[vocab][name]["failures"]]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
