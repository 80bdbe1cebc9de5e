"""The built-in model on this machine: folder size, launch-to-ready, TTFT, prefill and decode
tok/s, and what the Code pane's first completion costs, next to the old built-in model.

    .venv/bin/python -m bench.builtin_model [--rounds 4] [--threads 2]

Arms, each measurement in a fresh process, order rotated every round, best of --rounds:

- ``ours`` / ``og`` / ``og2``: our engine and onnxruntime-genai 0.18 (twice: og2 is the
  control arm, og vs og2 shows the run's noise) generating 256 tokens greedily on the
  built-in model after a 32- and a 512-token prompt (``bench._workers``, the same clock as
  bench.decode);
- ``old``: our engine on the old built-in model (tools/models/default-coder);
- ``serve-new`` / ``serve-old``: ``python -m engine serve`` started fresh: seconds to its
  ready line, then the Code pane's request (``/infill``, 16 tokens) on a 400-token file
  prefix cold, and again after a one-character edit on the last line (the prefix cache
  keeps everything before it).

Writes bench/out/builtin_model.json; the table goes in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _workers  # noqa: E402
from bench._fresh import run_worker  # noqa: E402

OUT = REPO / "bench" / "out"
NEW = REPO / "resources" / "models" / "smollm2-135m-instruct"
OLD = REPO / "tools" / "models" / "default-coder"
GEN_ARMS = ("ours", "og", "og2", "old")
SERVE_ARMS = ("serve-new", "serve-old")
PROMPT_SEED = 4321
FIM_PREFIX_TOKENS = 400


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def code_file_prefix(model: Path, tokens: int) -> tuple[str, str]:
    """A held-out standard-library file's first lines, about ``tokens`` tokens of the
    model's tokenizer (a file a user might be editing), and the line after them."""
    from tokenizers import Tokenizer

    from tools.default_model.corpus import load_corpus

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    for item in load_corpus().heldout:
        lines = item.text.splitlines(keepends=True)
        kept: list[str] = []
        used = 0
        for line in lines:
            used += len(tok.encode(line, add_special_tokens=False).ids)
            if used > tokens:
                break
            kept.append(line)
        if used > tokens and len(kept) > 10 and kept[-1].strip():
            return "".join(kept), lines[len(kept)]
    raise RuntimeError("no held-out file is long enough")


def _post(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
    return answer, (time.perf_counter() - start) * 1e3


def run_serve(model: Path, threads: int) -> dict[str, Any]:
    """A fresh worker: launch-to-ready, then a cold and an after-edit /infill."""
    prefix, _ = code_file_prefix(model, FIM_PREFIX_TOKENS)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model),
                             "--port", "0", "--threads", str(threads), "--no-kv-store"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        ready_s = time.perf_counter() - start
        if not line:
            raise RuntimeError(proc.stderr.read() if proc.stderr else "worker died")
        url = json.loads(line)["url"]
        body = {"input_prefix": prefix, "input_suffix": "\n", "n_predict": 16,
                "temperature": 0, "cache_prompt": True}
        cold, cold_ms = _post(url + "/infill", body)
        # a one-character edit on the last line: everything before it is cached
        edited = {**body, "input_prefix": prefix[:-2] + "x" + prefix[-1]}
        warm, warm_ms = _post(url + "/infill", edited)
    finally:
        proc.terminate()
        proc.wait(30)
    t_cold, t_warm = cold.get("timings", {}), warm.get("timings", {})
    return {"ready_s": ready_s, "cold_ms": cold_ms, "warm_ms": warm_ms,
            "cold_prompt_n": t_cold.get("prompt_n"), "warm_prompt_n": t_warm.get("prompt_n"),
            "cold_prompt_ms": t_cold.get("prompt_ms"), "warm_prompt_ms": t_warm.get("prompt_ms"),
            "cold_text": cold.get("content"), "warm_text": warm.get("content"),
            "tokens_evaluated": cold.get("tokens_evaluated"),
            "warm_tokens_cached": warm.get("tokens_cached")}


def worker_main(args: argparse.Namespace) -> None:
    if args.worker in SERVE_ARMS:
        result = run_serve(NEW if args.worker == "serve-new" else OLD, args.threads)
    else:
        model = OLD if args.worker == "old" else NEW
        vocab = _workers.model_vocab(model)
        prompt = _workers.prompt_ids(vocab, args.prompt_len, PROMPT_SEED)
        warmup = _workers.prompt_ids(vocab, _workers.WARMUP_PROMPT, PROMPT_SEED + 1)
        if args.worker in ("ours", "old"):
            result = _workers.run_ours(model, prompt, warmup, args.new_tokens, args.threads,
                                       spin=True)
        else:
            result = _workers.run_og(model, prompt, warmup, args.new_tokens, args.threads)
        result.pop("tokens", None)
    if args.worker not in SERVE_ARMS:  # (a serve arm's own process only sends requests)
        result["peak_rss_mib"] = _workers.proc_status_mib().get("vm_hwm_mib")
    print(json.dumps(result), flush=True)


def _best(rows: list[dict[str, Any]], key: str, lowest: bool = False) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return None
    return min(values) if lowest else max(values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-lens", default="32,512")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--worker", choices=[*GEN_ARMS, *SERVE_ARMS], help=argparse.SUPPRESS)
    p.add_argument("--prompt-len", type=int, default=32, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    lens = [int(n) for n in args.prompt_lens.split(",") if n]
    old_context = int(json.loads((OLD / "genai_config.json").read_text())["model"]
                      ["context_length"])
    # the old model's context (512) holds no 512-token prompt with 256 tokens after it
    jobs = [(arm, n) for n in lens for arm in GEN_ARMS
            if arm != "old" or n + args.new_tokens <= old_context]
    jobs += [(arm, 0) for arm in SERVE_ARMS]
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        shift = rnd % len(jobs)
        for arm, n in jobs[shift:] + jobs[:shift]:
            extra = ["--prompt-len", str(n)] if n else []
            result = run_worker("bench.builtin_model", "--worker", arm, "--threads",
                                str(args.threads), "--new-tokens", str(args.new_tokens),
                                *extra)
            runs.append({"arm": arm, "prompt_len": n, "round": rnd, **result})
            print(f"round {rnd} {arm} {n}: " + ", ".join(
                f"{k} {v:.1f}" for k, v in result.items() if isinstance(v, float)), flush=True)
    table: dict[str, Any] = {"sizes_mib": {"new": _folder_bytes(NEW) / 2**20,
                                           "old": _folder_bytes(OLD) / 2**20}}
    for arm, n in jobs:
        rows = [r for r in runs if r["arm"] == arm and r["prompt_len"] == n]
        if arm in SERVE_ARMS:
            table[arm] = {k: _best(rows, k, lowest=True) for k in
                          ("ready_s", "cold_ms", "warm_ms", "cold_prompt_ms", "warm_prompt_ms")}
            table[arm].update({k: rows[-1].get(k) for k in
                               ("cold_prompt_n", "warm_prompt_n", "cold_text", "warm_text")})
        else:
            table[f"{arm}@{n}"] = {"decode_tok_s": _best(rows, "decode_tok_s"),
                                   "prefill_tok_s": _best(rows, "prefill_tok_s"),
                                   "ttft_ms": _best(rows, "ttft_ms", lowest=True),
                                   "load_ms": _best(rows, "load_ms", lowest=True),
                                   "peak_rss_mib": _best(rows, "peak_rss_mib", lowest=True)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "builtin_model.json").write_text(json.dumps({"table": table, "runs": runs},
                                                            indent=2))
    print(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
