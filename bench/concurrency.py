"""Concurrency through the scheduler: batched streams and an urgent FIM beside a chat.

1. Aggregate throughput: 4 greedy streams submitted together (decoded as one batch) vs
   one stream alone; goal >= 2.5x tokens/s.
2. Priority: a high-priority FIM request (a 500-token prompt) submitted while a normal
   chat streams; its TTFT vs the same request on an idle engine; goal <= 1.5x.

    python -m bench.concurrency [--model int4|fp32] [--rounds 3] [--threads 2]

Each round runs in a fresh process; the best of the rounds is reported.
Writes bench/out/concurrency.json.
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
NEW_TOKENS = 128


def _stream_rate(engine: Any, prompts: list[list[int]]) -> float:
    """Aggregate generated tokens/s of `prompts` run together, first token to last."""
    from engine import GenerateOptions, GenerateRequest
    from engine.scheduling.scheduler import Scheduler

    scheduler = Scheduler(engine)
    stamps: list[float] = []

    def sink(item: Any) -> None:
        if isinstance(item, BaseException):
            raise item
        if item.token_id is not None:
            stamps.append(item.timestamp)

    # one token a step, as the peers decode
    opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=NEW_TOKENS,
                           speculative_mode="none")
    for ids in prompts:
        scheduler.submit(GenerateRequest(token_ids=tuple(ids), options=opts), sink)
    while scheduler.step():
        pass
    return (len(stamps) - len(prompts)) / (max(stamps) - min(stamps))


def _fim_ttft(engine: Any, fim: list[int], chat: list[int] | None) -> float:
    from engine import GenerateOptions, GenerateRequest
    from engine.scheduling.scheduler import Scheduler

    scheduler = Scheduler(engine)
    results: dict[str, Any] = {}

    def sink_for(name: str) -> Any:
        def sink(item: Any) -> None:
            if isinstance(item, BaseException):
                raise item
            if item.result is not None:
                results[name] = item.result
        return sink

    if chat is not None:
        scheduler.submit(GenerateRequest(token_ids=tuple(chat), options=GenerateOptions(
            temperature=0.0, stop_on_eos=False, max_new_tokens=NEW_TOKENS)), sink_for("chat"))
        for _ in range(20):  # the chat is streaming when the editor asks
            scheduler.step()
    scheduler.submit(GenerateRequest(token_ids=tuple(fim), options=GenerateOptions(
        temperature=0.0, stop_on_eos=False, max_new_tokens=16)), sink_for("fim"),
        priority="high")
    while "fim" not in results:
        scheduler.step()
    ttft: float = results["fim"].timings.ttft_ms
    return ttft


def worker(model: Path, threads: int) -> dict[str, Any]:
    import numpy as np

    from engine import Engine, EngineConfig

    rng = np.random.default_rng(1)

    def fresh() -> Any:
        engine = Engine.load(model, EngineConfig(intra_op_threads=threads, max_batch=4,
                                                 prefix_cache=False))
        engine.wait_huge_pages()  # the background collapse would share the cores with the run
        return engine

    engine = fresh()
    vocab = engine.spec.vocab_size
    prompts = [rng.integers(1, vocab, 32).tolist() for _ in range(4)]
    _stream_rate(engine, [prompts[0][:8]])  # warm-up
    one = _stream_rate(engine, prompts[:1])
    four = _stream_rate(engine, prompts)
    fim = rng.integers(1, vocab, 500).tolist()
    chat = rng.integers(1, vocab, 64).tolist()
    idle = _fim_ttft(fresh(), fim, None)
    busy = _fim_ttft(fresh(), fim, chat)
    return {"one_stream_tok_s": one, "four_streams_tok_s": four, "fim_idle_ttft_ms": idle,
            "fim_busy_ttft_ms": busy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("int4", "fp32"), default="int4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", type=Path)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads)))
        return 0
    from bench.decode import build_models

    model = build_models(OUT, [args.model])[args.model]
    started = time.perf_counter()
    runs = [run_worker("bench.concurrency", "--worker", str(model), "--threads",
                       str(args.threads)) for _ in range(args.rounds)]
    best = {"one_stream_tok_s": max(r["one_stream_tok_s"] for r in runs),
            "four_streams_tok_s": max(r["four_streams_tok_s"] for r in runs),
            "fim_idle_ttft_ms": min(r["fim_idle_ttft_ms"] for r in runs),
            "fim_busy_ttft_ms": min(r["fim_busy_ttft_ms"] for r in runs)}
    scale = best["four_streams_tok_s"] / best["one_stream_tok_s"]
    fim = best["fim_busy_ttft_ms"] / best["fim_idle_ttft_ms"]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "concurrency.json").write_text(json.dumps(
        {"model": str(model), "runs": runs, "best": best, "aggregate_scaling": scale,
         "fim_ttft_ratio": fim, "elapsed_s": time.perf_counter() - started}, indent=1))
    print(f"1 stream {best['one_stream_tok_s']:.0f} tok/s, 4 streams "
          f"{best['four_streams_tok_s']:.0f} tok/s aggregate -> {scale:.2f}x (goal >= 2.5x)")
    print(f"FIM TTFT idle {best['fim_idle_ttft_ms']:.0f} ms, beside a streaming chat "
          f"{best['fim_busy_ttft_ms']:.0f} ms -> {fim:.2f}x (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
