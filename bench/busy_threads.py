"""Decode and prefill beside busy programs: the engine's threads that follow what the CPU
has free (engine.runtime.cpu_share) against the same engine with ``--fixed-threads``.

Each run is ``python -m engine generate`` in a fresh process on the built-in model: a
``--prompt-len``-token prompt (random ids, no training text), ``--new-tokens`` greedy
tokens, ``--threads``, its own ``timings`` (prefill and decode tok/s). Quiet runs first
(nothing beside), then with 1, 2, 4 (``--busy``) processes spinning a core each, started
before the runs and stopped after; in each, the arms ``adaptive`` (as shipped),
``fixed`` (``--fixed-threads``) and ``adaptive2`` (the control: the same as
``adaptive`` again), order rotated each round; best of ``--rounds``. Reports each arm's
tok/s, its share of the quiet figure, and adaptive / fixed.

    .venv/bin/python -m bench.busy_threads [--busy 0,1,2,4] [--rounds 3] [--threads 2]

Writes bench/out/busy_threads.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._fresh import run_worker  # noqa: E402

OUT = REPO / "bench" / "out"
ARMS = ("adaptive", "fixed", "adaptive2")


def _spin() -> None:
    while True:
        pass


def one_run(arm: str, ids: str, new_tokens: int, threads: int) -> dict[str, Any]:
    from engine.model.default_model import default_model_dir

    model = default_model_dir()
    if model is None:
        raise SystemExit("no built-in model in this checkout")
    extra = ["--fixed-threads"] if arm == "fixed" else []
    got = run_worker("engine", "generate", "--model", str(model), "--token-ids", ids,
                     "--max-new-tokens", str(new_tokens), "--threads", str(threads),
                     "--speculative", "none", "--json", *extra)
    timings = got["timings"]
    return {"arm": arm, "prefill_tok_s": timings["prefill_tok_s"],
            "decode_tok_s": timings["decode_tok_s"], "tokens": len(got["token_ids"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", default="0,1,2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=OUT / "busy_threads.json")
    args = p.parse_args(argv)
    rng = random.Random(7)
    ids = ",".join(str(rng.randrange(100, 40000)) for _ in range(args.prompt_len))
    runs: list[dict[str, Any]] = []
    for busy in [int(b) for b in args.busy.split(",") if b]:
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
        for proc in spinners:
            proc.start()
        try:
            time.sleep(1.0)
            for rnd in range(args.rounds):
                order = ARMS[rnd % len(ARMS):] + ARMS[:rnd % len(ARMS)]
                for arm in order:
                    got = one_run(arm, ids, args.new_tokens, args.threads)
                    runs.append({**got, "busy": busy, "round": rnd, "load": os.getloadavg()[0]})
                    print(f"busy {busy} round {rnd} {arm}: prefill {got['prefill_tok_s']:.0f} "
                          f"decode {got['decode_tok_s']:.1f} tok/s", flush=True)
        finally:
            for proc in spinners:
                proc.terminate()
            for proc in spinners:
                proc.join(10)
    best: dict[tuple[int, str], dict[str, float]] = {}
    for run in runs:
        key = (run["busy"], run["arm"])
        mine = best.setdefault(key, {"prefill": 0.0, "decode": 0.0})
        mine["prefill"] = max(mine["prefill"], run["prefill_tok_s"])
        mine["decode"] = max(mine["decode"], run["decode_tok_s"])
    quiet = {arm: best.get((0, arm)) for arm in ARMS}
    print("\n| busy | decode tok/s adaptive / fixed / adaptive2 | prefill tok/s adaptive / "
          "fixed / adaptive2 | adaptive / fixed: decode, prefill | decode of quiet: adaptive, "
          "fixed |")
    print("|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for busy in sorted({b for b, _ in best}):
        row = {arm: best[(busy, arm)] for arm in ARMS if (busy, arm) in best}
        share = {arm: row[arm]["decode"] / q["decode"] for arm, q in quiet.items()
                 if q and arm in row}
        summary[str(busy)] = {"best": row, "decode_of_quiet": share,
                              "adaptive/fixed": {k: row["adaptive"][k] / row["fixed"][k]
                                                 for k in ("decode", "prefill")}}
        decode = " / ".join(f"{row[a]['decode']:.1f}" for a in row)
        prefill = " / ".join(f"{row[a]['prefill']:.0f}" for a in row)
        print(f"| {busy} | {decode} | {prefill} | "
              f"{row['adaptive']['decode'] / row['fixed']['decode']:.2f}, "
              f"{row['adaptive']['prefill'] / row['fixed']['prefill']:.2f} | "
              f"{share.get('adaptive', 0):.0%}, {share.get('fixed', 0):.0%} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "command": "python -m bench.busy_threads " + " ".join(argv or sys.argv[1:]),
        "summary": summary, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
