"""A second request sharing a 1,000-token prefix: how much of the cold prefill remains.

Three requests per fresh process: A = shared 1,000 tokens + 32 of its own (cold), then an
unrelated request that takes the runner, then B = the same 1,000 tokens + 32 others. B is
served from the prefix cache (pages), not from the live slot. A third variant, B right
after A, measures the live slot. Reported: prefill time (TTFT) of B / A; goal <= 10%.

    python -m bench.prefix_reuse [--model int4|fp32] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench._fresh import run_worker

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"


def worker(model: Path, threads: int) -> dict[str, Any]:
    import numpy as np

    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest

    engine = Engine.load(model, EngineConfig(intra_op_threads=threads))
    rng = np.random.default_rng(0)
    vocab = engine.spec.vocab_size
    shared, a, b, other = (rng.integers(1, vocab, n).tolist() for n in (1000, 32, 32, 300))
    opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=4)

    def ttft(ids: list[int]) -> tuple[float, int]:
        res = engine.generate(GenerateRequest(token_ids=tuple(ids), options=opts))
        return res.timings.ttft_ms, res.prefix_cache_hit_len

    engine.generate(GenerateRequest(token_ids=(1, 2, 3), options=opts))  # warm-up
    cold, _ = ttft(shared + a)
    ttft(other)
    paged, paged_hit = ttft(shared + b)
    ttft(shared + a)
    live, live_hit = ttft(shared + b[::-1])
    return {"cold_ms": cold, "paged_ms": paged, "paged_hit": paged_hit, "live_ms": live,
            "live_hit": live_hit}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("int4", "fp32"), default="int4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", type=Path)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads)))
        return 0
    from bench.decode import build_models

    model = build_models(OUT, [args.model])[args.model]
    runs = [run_worker("bench.prefix_reuse", "--worker", str(model), "--threads",
                       str(args.threads), timeout=900) for _ in range(args.rounds)]
    best = {k: min(r[k] for r in runs) for k in ("cold_ms", "paged_ms", "live_ms")}
    summary = {"runs": runs, "best": best, "hits": {"paged": runs[0]["paged_hit"],
                                                   "live": runs[0]["live_hit"]},
               "paged_over_cold": best["paged_ms"] / best["cold_ms"],
               "live_over_cold": best["live_ms"] / best["cold_ms"]}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prefix_reuse.json").write_text(json.dumps(summary, indent=1))
    print(f"cold 1,032-token prefill {best['cold_ms']:.0f} ms; sharing 1,000 tokens: "
          f"prefix cache {best['paged_ms']:.0f} ms ({summary['paged_over_cold']:.1%}, hit "
          f"{runs[0]['paged_hit']}), live slot {best['live_ms']:.0f} ms "
          f"({summary['live_over_cold']:.1%}, hit {runs[0]['live_hit']}); goal <= 10%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
