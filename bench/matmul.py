"""The engine's MatMulNBits against ONNX Runtime's, on the built-in model (or --model DIR):
decode and prefill.

    .venv/bin/python -m bench.matmul [--rounds 5] [--threads 2] [--prompt-lens 32,512]
                                     [--model DIR]

Arms, each measurement in a fresh process, order rotated every round, best of --rounds:

- ``ours``: the engine as it loads by default (its own MatMulNBits, engine/kernels);
- ``ours-ortmm``: the same with ONNX_GENAI_MATMUL=0 (ONNX Runtime's MatMulNBits; the
  attention kernel stays the engine's);
- ``og``: onnxruntime-genai on the same folder;
- ``before``: the engine of another checkout (--before PATH, e.g. a worktree of the
  commit before these kernels), for "no slower than before".

Each generates --new-tokens greedily after a prompt of each length (bench._workers, the
clock of bench.decode and bench.builtin_model). The table gives ours / other of the bests
and, as "paired", the median over rounds of the ratio within a round. Writes
bench/out/matmul.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # after PYTHONPATH: a `before` worker imports its own engine
    sys.path.append(str(REPO))

from bench import _workers  # noqa: E402

OUT = REPO / "bench" / "out"
MODEL = REPO / "resources" / "models" / "smollm2-135m-instruct"
ARMS = ("ours", "ours-ortmm", "og", "before")
PROMPT_SEED = 1234


def worker_main(args: argparse.Namespace) -> None:
    model = Path(args.model)
    vocab = _workers.model_vocab(model)
    prompt = _workers.prompt_ids(vocab, args.prompt_len, PROMPT_SEED)
    warmup = _workers.prompt_ids(vocab, _workers.WARMUP_PROMPT, PROMPT_SEED + 1)
    if args.worker == "og":
        result = _workers.run_og(model, prompt, warmup, args.new_tokens, args.threads)
    else:
        result = _workers.run_ours(model, prompt, warmup, args.new_tokens, args.threads,
                                   spin=True)
    result.pop("tokens", None)
    print(json.dumps(result), flush=True)


def run_worker(arm: str, prompt_len: int, args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.before).resolve() if arm == "before" else REPO
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{REPO}"}
    env["ONNX_GENAI_MATMUL"] = "0" if arm == "ours-ortmm" else "1"
    # the worker is this file; the engine it imports is `repo`'s
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", arm, "--prompt-len",
         str(prompt_len), "--threads", str(args.threads), "--new-tokens",
         str(args.new_tokens), "--model", str(Path(args.model).resolve())],
        cwd=repo, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{arm} failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _paired(runs: list[dict[str, Any]], other: str, n: int) -> dict[str, float]:
    """The median over rounds of ours / `other` within a round: steadier than the ratio of
    bests where other programs load the machine now and then (a best may come from a quiet
    moment that only one arm had)."""
    out: dict[str, float] = {}
    for key in ("decode_tok_s", "prefill_tok_s"):
        ratios = []
        for rnd in {r["round"] for r in runs}:
            got = {r["arm"]: r[key] for r in runs if r["round"] == rnd and r["prompt_len"] == n}
            if "ours" in got and other in got and got[other] > 0:
                ratios.append(got["ours"] / got[other])
        if ratios:
            out[key] = statistics.median(ratios)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-lens", default="32,512")
    p.add_argument("--arms", default="ours,ours-ortmm,og")
    p.add_argument("--model", default=str(MODEL), help="a model folder (default: built-in)")
    p.add_argument("--before", default=None, help="a checkout for the `before` arm")
    p.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--prompt-len", type=int, default=32, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    arms = [a for a in args.arms.split(",") if a]
    jobs = [(arm, int(n)) for n in args.prompt_lens.split(",") if n for arm in arms]
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        shift = rnd % len(jobs)
        for arm, n in jobs[shift:] + jobs[:shift]:
            result = run_worker(arm, n, args)
            runs.append({"arm": arm, "prompt_len": n, "round": rnd, **result})
            print(f"round {rnd} {arm:10} {n:4}: decode {result['decode_tok_s']:.1f} tok/s, "
                  f"prefill {result['prefill_tok_s']:.1f} tok/s", flush=True)
    table: dict[str, Any] = {}
    for arm, n in jobs:
        rows = [r for r in runs if r["arm"] == arm and r["prompt_len"] == n]
        table[f"{arm}@{n}"] = {k: max(r[k] for r in rows) for k in
                               ("decode_tok_s", "prefill_tok_s")}
    for n in {n for _, n in jobs}:
        ours = table.get(f"ours@{n}")
        for other in ("ours-ortmm", "og", "before"):
            theirs = table.get(f"{other}@{n}")
            if ours and theirs:
                table[f"ours/{other}@{n}"] = {k: ours[k] / theirs[k] for k in ours}
                table[f"ours/{other}@{n} paired"] = _paired(runs, other, n)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "matmul.json").write_text(json.dumps({"table": table, "runs": runs}, indent=2))
    print(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
