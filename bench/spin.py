"""How long ONNX Runtime's idle threads should spin in the worker: speed and CPU by setting.

Between two operators of one decode step the intra-op pool's threads wait a few
microseconds; with spinning off they sleep and each parallel operator must wake them,
with ORT's default spin they burn CPU long after a request ends. This benchmark decodes
greedily (256 tokens after a 32-token prompt) with each ``spin_duration_us`` setting, each
in a fresh process, order rotated, on a quiet machine and beside 1 and 2 CPU-bound
processes (busy loops started by this script), and reports:

- decode tok/s (median and best of the rounds);
- CPU seconds the process uses in 1 s of idling after the request (threads left spinning);
- CPU seconds for an editor-like pattern: five 16-token requests 150 ms apart.

    .venv/bin/python -m bench.spin [--model int4|fp32|default-coder] [--spins 0,5,10,default]
                                   [--rounds 3] [--busy 0,1,2]

Writes bench/out/spin-MODEL.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._fresh import run_worker  # noqa: E402

OUT = REPO / "bench" / "out"
DEFAULT_MODEL = REPO / "tools" / "models" / "default-coder"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker(model: Path, spin: str, threads: int) -> dict[str, Any]:
    import numpy as np

    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest

    engine = Engine.load(model, EngineConfig(
        intra_op_threads=threads, spin_duration_us=None if spin == "default" else int(spin),
        prefix_cache=False))
    engine.wait_huge_pages()
    ids = tuple(np.random.default_rng(1).integers(1, engine.spec.vocab_size, 32).tolist())

    def run(n: int) -> Any:
        # one token a step, as the peers decode
        options = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=n,
                                  speculative_mode="none")
        return engine.generate(GenerateRequest(token_ids=ids, options=options))

    run(8)  # warm-up
    result = run(256)
    before = _cpu_s()
    time.sleep(1.0)
    idle = _cpu_s() - before
    before, started = _cpu_s(), time.perf_counter()
    for _ in range(5):
        run(16)
        time.sleep(0.15)
    return {"decode_tok_s": result.timings.decode_tok_s, "idle_cpu_s": idle,
            "editor_cpu_s": _cpu_s() - before, "editor_wall_s": time.perf_counter() - started}


def _busy_loop() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default-coder",
                    help="int4 / fp32 (the bench models of bench.decode), default-coder, "
                         "or a model folder")
    ap.add_argument("--spins", default="0,5,10,default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", default="0,1,2", help="CPU-bound processes beside the run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "SPIN"))
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(Path(args.worker[0]), args.worker[1], args.threads)))
        return 0
    if args.model in ("int4", "fp32"):
        from bench.decode import build_models

        model = build_models(OUT, [args.model])[args.model]
    else:
        model = DEFAULT_MODEL if args.model == "default-coder" else Path(args.model)
    spins = args.spins.split(",")
    report: dict[str, Any] = {"model": str(model), "threads": args.threads, "conditions": {}}
    for busy in (int(b) for b in args.busy.split(",")):
        loops = [multiprocessing.Process(target=_busy_loop, daemon=True) for _ in range(busy)]
        for p in loops:
            p.start()
        try:
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in spins}
            for r in range(args.rounds):
                for spin in spins[r % len(spins):] + spins[:r % len(spins)]:
                    runs[spin].append(run_worker("bench.spin", "--worker", str(model), spin,
                                                 "--threads", str(args.threads)))
        finally:
            for p in loops:
                p.terminate()
        report["conditions"][f"busy={busy}"] = runs
        print(f"\n{busy} busy process(es) beside the run, {args.rounds} rounds")
        print("| spin µs | decode tok/s median (best) | vs spin 0 | idle CPU s in 1 s | "
              "editor pattern CPU s |")
        print("|---|---|---|---|---|")
        base = statistics.median(x["decode_tok_s"] for x in runs[spins[0]])
        for spin, rs in runs.items():
            rates = [x["decode_tok_s"] for x in rs]
            print(f"| {spin} | {statistics.median(rates):.0f} ({max(rates):.0f}) | "
                  f"{statistics.median(rates) / base:.2f}x | "
                  f"{max(x['idle_cpu_s'] for x in rs):.3f} | "
                  f"{statistics.median(x['editor_cpu_s'] for x in rs):.2f} |")
    OUT.mkdir(parents=True, exist_ok=True)
    name = args.model if args.model in ("int4", "fp32", "default-coder") else model.name
    (OUT / f"spin-{name}.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
