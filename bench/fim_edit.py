"""Editor-style FIM: the same 2,000-token file re-sent at every keystroke.

A completion is requested with the cursor near the end of a 2,000-token Python file; then
one character is typed at the cursor and a completion is requested again, 20 times. Our
engine keeps the file's KV warm (live slot + prefix cache) and prefills only what changed;
onnxruntime-genai recomputes the whole prompt each time. Both get the same prompt token
ids (our tokenizer and FIM layout), greedy, and must produce the same completions.

    python -m bench.fim_edit [--model int4|fp32] [--edits 20] [--rounds 2] [--threads 2]

Each engine runs in a fresh process per round (order rotated); per edit the best TTFT over
rounds is kept; the report gives medians and their ratio. Writes bench/out/fim_edit.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench._fresh import run_worker

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
FILE_TOKENS = 2000
CURSOR_FRACTION = 0.95
NEW_TOKENS = 16


def source_text(tokenizer: Any, tokens: int) -> str:
    """Real Python source (stdlib, PSF licence) cut to about `tokens` tokens."""
    import argparse as stdlib_module

    text = Path(stdlib_module.__file__).read_text(encoding="utf-8")
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix with at most `tokens` tokens
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(text[:mid], parse_special=False)) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def edit_prompts(model: Path, edits: int) -> list[list[int]]:
    """Prompt ids of the first request and of each request after one typed character."""
    from engine.text.fim import build_fim_ids, require_fim
    from engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(model)
    family = require_fim(tok)
    text = source_text(tok, FILE_TOKENS)
    cursor = int(len(text) * CURSOR_FRACTION)
    typed = "result = compute_value(x)\n"
    prompts = []
    for i in range(edits + 1):
        prompts.append(build_fim_ids(tok, family, text[:cursor], text[cursor:]))
        ch = typed[i % len(typed)]
        text = text[:cursor] + ch + text[cursor:]
        cursor += 1
    return prompts


def worker(arm: str, model: Path, prompts: list[list[int]], threads: int) -> dict[str, Any]:
    if arm == "ours":
        from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest

        engine = Engine.load(model, EngineConfig(intra_op_threads=threads))
        # one token a step, as the peers decode
        opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=NEW_TOKENS,
                               speculative_mode="none")
        rows = []
        for ids in prompts:
            res = engine.generate(GenerateRequest(token_ids=tuple(ids), options=opts))
            rows.append({"ttft_ms": res.timings.ttft_ms, "hit": res.prefix_cache_hit_len,
                         "prompt": len(ids), "tokens": list(res.token_ids)})
        return {"rows": rows}
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(str(model))
    config.overlay(json.dumps(
        {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    og_model = og.Model(config)
    rows = []
    for ids in prompts:
        start = time.perf_counter()
        params = og.GeneratorParams(og_model)
        total = len(ids) + NEW_TOKENS
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        gen = og.Generator(og_model, params)
        gen.append_tokens(np.asarray(ids, dtype=np.int32))
        gen.generate_next_token()
        ttft = (time.perf_counter() - start) * 1e3
        while not gen.is_done():
            gen.generate_next_token()
        tokens = [int(t) for t in gen.get_sequence(0)][len(ids):]
        rows.append({"ttft_ms": ttft, "hit": 0, "prompt": len(ids), "tokens": tokens})
    return {"rows": rows}


def spawn(arm: str, model: Path, edits: int, threads: int) -> dict[str, Any]:
    return run_worker("bench.fim_edit", "--worker", arm, "--model-dir", str(model),
                      "--edits", str(edits), "--threads", str(threads))


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    best = {arm: [min(r["rows"][i]["ttft_ms"] for r in rs) for i in range(len(rs[0]["rows"]))]
            for arm, rs in runs.items()}
    ours, og_rows = runs["ours"][0]["rows"], runs["og"][0]["rows"]
    same = [a["tokens"] == b["tokens"] for a, b in zip(ours, og_rows, strict=True)]
    # edit 0 is cold for both engines; the editing loop is edits 1..N
    med = {arm: statistics.median(v[1:]) for arm, v in best.items()}
    return {
        "ttft_ms_per_edit": best, "median_ttft_ms": med,
        "speedup": med["og"] / med["ours"], "cold_ttft_ms": {a: v[0] for a, v in best.items()},
        "prefilled_tokens_ours": [r["prompt"] - r["hit"] for r in ours],
        "prompt_tokens": [r["prompt"] for r in ours],
        "identical_completions": f"{sum(same)}/{len(same)}",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("int4", "fp32"), default="int4")
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", choices=("ours", "og"))
    ap.add_argument("--model-dir", type=Path)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.model_dir,
                                edit_prompts(args.model_dir, args.edits), args.threads)))
        return 0
    from bench.decode import build_models

    model = build_models(OUT, [args.model])[args.model]
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "og": []}
    for r in range(args.rounds):
        for arm in (("ours", "og") if r % 2 == 0 else ("og", "ours")):
            runs[arm].append(spawn(arm, model, args.edits, args.threads))
            print(f"round {r} {arm} done", file=sys.stderr)
    summary = summarize(runs)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fim_edit.json").write_text(json.dumps({"model": str(model), **summary}, indent=1))
    print(f"prompt tokens {summary['prompt_tokens'][0]}, prefilled by ours per edit "
          f"{summary['prefilled_tokens_ours'][1:]}")
    print(f"median TTFT over {args.edits} edits: ours {summary['median_ttft_ms']['ours']:.1f} ms"
          f", onnxruntime-genai {summary['median_ttft_ms']['og']:.1f} ms -> "
          f"{summary['speedup']:.1f}x (goal >= 10x); cold: {summary['cold_ttft_ms']}")
    print(f"identical greedy completions: {summary['identical_completions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
