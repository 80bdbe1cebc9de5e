"""Decode benchmark: our Engine vs onnxruntime-genai 0.18 on a forged 125M-parameter model.

Run from the repository root:  .venv/bin/python -m bench.decode  (see bench/README.md).
Every measurement runs in a fresh process (this script with --worker), arms rotate each
round, and the best of --rounds counts. Writes bench/out/decode.json and decode.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/decode.py` as well as `python -m bench.decode`
    sys.path.insert(0, str(REPO))

from bench import _workers  # noqa: E402

OUT = REPO / "bench" / "out"
ARMS = ("ours", "og", "og2", "ours-nospin", "ours-4k")
SPEC = {"layers": 12, "hidden": 768, "heads": 12, "kv_heads": 4, "intermediate": 2048,
        "vocab": 32000, "context": 2048, "seed": 0}
PROMPT_SEED = 1234
DECODE_TARGET = {"int4": 1.10, "fp32": 1.00}
PREFILL_TARGET = 1.0
RSS_TARGET = 1.1
CONTROL_TOLERANCE = 0.03


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6, help="rounds per arm; best counts")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--quick", action="store_true", help="1 round, 64 tokens (smoke test)")
    p.add_argument("--arms", default=",".join(ARMS), help="comma list of " + ",".join(ARMS))
    p.add_argument("--precisions", default="fp32,int4")
    p.add_argument("--prompt-lens", default="32,512")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--worker", choices=[*ARMS, "bandwidth", "build"], help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--prompt-len", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.new_tokens = 1, 64
    args.arms = [a for a in args.arms.split(",") if a]
    args.precisions = [p for p in args.precisions.split(",") if p]
    args.prompt_lens = [int(n) for n in args.prompt_lens.split(",") if n]
    if bad := set(args.arms) - set(ARMS) or set(args.precisions) - set(DECODE_TARGET):
        p.error(f"unknown arm or precision: {sorted(bad)}")
    return args


def worker_main(args: argparse.Namespace) -> None:
    if args.worker == "build":  # in its own process: the parent stays small (see spawn)
        models = build_models(args.out, args.precisions)
        print(json.dumps({p: str(m) for p, m in models.items()}), flush=True)
        return
    if args.worker == "bandwidth":
        result = _workers.run_bandwidth(args.threads)
    else:
        vocab = _workers.model_vocab(args.model)
        prompt = _workers.prompt_ids(vocab, args.prompt_len, PROMPT_SEED)
        warmup = _workers.prompt_ids(vocab, _workers.WARMUP_PROMPT, PROMPT_SEED + 1)
        if args.worker.startswith("ours"):
            result = _workers.run_ours(args.model, prompt, warmup, args.new_tokens,
                                       args.threads, spin=args.worker != "ours-nospin",
                                       huge_pages=args.worker != "ours-4k")
        else:
            result = _workers.run_og(args.model, prompt, warmup, args.new_tokens, args.threads)
    result["peak_rss_mib"] = _workers.peak_rss_mib()
    result.update(_workers.proc_status_mib())
    print(json.dumps(result), flush=True)


def spawn(arm: str, *extra: str) -> dict[str, Any]:
    """Run one worker in a fresh process and parse its JSON line.

    ru_maxrss survives exec on Linux (a child starts at its parent's peak), so the parent
    must stay small: models are built in a worker too, matplotlib loads only at the end.
    """
    cmd = [sys.executable, "-m", "bench.decode", "--worker", arm, *extra]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"worker {arm} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def build_models(out: Path, precisions: list[str]) -> dict[str, Path]:
    """The forged genai model (fp32) and its int4 copy, built once under out/models/."""
    from tests.forge import ForgeSpec, quantize_int4, write_genai_model

    spec = ForgeSpec(**SPEC)  # type: ignore[arg-type]
    stem = "genai-L{layers}-H{hidden}-A{heads}-KV{kv_heads}-I{intermediate}-V{vocab}".format(
        **SPEC)
    dirs = {p: out / "models" / f"{stem}-{p}" for p in ("fp32", "int4")}
    for prec in ("fp32", "int4"):
        final = dirs[prec]
        if final.is_dir() or (prec == "int4" and "int4" not in precisions):
            continue
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.perf_counter()
        if prec == "fp32":
            write_genai_model(tmp, spec, external_data=True)
        else:
            quantize_int4(dirs["fp32"], tmp, block_size=32)
        tmp.rename(final)
        print(f"built {final} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return {p: dirs[p] for p in precisions}


def weights_bytes(model: Path) -> int:
    return sum((model / f).stat().st_size for f in ("model.onnx", "model.onnx.data"))


def leading_match(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def _best(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {}
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        if rs:
            best[arm] = {"decode_tok_s": max(r["decode_tok_s"] for r in rs),
                         "decode_tok_s_median": statistics.median(r["decode_tok_s"] for r in rs),
                         "prefill_tok_s": max(r["prefill_tok_s"] for r in rs),
                         "ttft_ms": min(r["ttft_ms"] for r in rs),
                         "peak_rss_mib": min(r["peak_rss_mib"] for r in rs),
                         "load_ms": min(r["load_ms"] for r in rs), "runs": len(rs)}
    return best


def _ratios(best: dict[str, dict[str, float]]) -> dict[str, float | None]:
    def r(a: str, b: str, key: str) -> float | None:
        num, den = best.get(a, {}).get(key), best.get(b, {}).get(key)
        return num / den if num and den else None

    return {"decode": r("ours", "og", "decode_tok_s"), "prefill": r("ours", "og", "prefill_tok_s"),
            "rss": r("ours", "og", "peak_rss_mib"),
            "control_decode": r("og2", "og", "decode_tok_s"),
            "control_prefill": r("og2", "og", "prefill_tok_s"),
            "nospin_decode": r("ours-nospin", "ours", "decode_tok_s"),
            "nospin_prefill": r("ours-nospin", "ours", "prefill_tok_s"),
            "small_pages_decode": r("ours-4k", "ours", "decode_tok_s")}


def summarize(runs: list[dict[str, Any]], models: dict[str, Path],
              bandwidth: list[dict[str, Any]], threads: int) -> dict[str, Any]:
    measured = max((b["gb_s"] for b in bandwidth if b["threads"] == threads), default=None)
    workloads = []
    for prec, model in models.items():
        wbytes = weights_bytes(model)
        embed = SPEC["vocab"] * SPEC["hidden"] * 4
        for plen in sorted({r["prompt_len"] for r in runs if r["precision"] == prec}):
            mine = [r for r in runs if r["precision"] == prec and r["prompt_len"] == plen]
            best = _best(mine)
            ratios = _ratios(best)
            checks = {"decode": (ratios["decode"], ">=", DECODE_TARGET[prec]),
                      "prefill": (ratios["prefill"], ">=", PREFILL_TARGET),
                      "rss": (ratios["rss"], "<=", RSS_TARGET)}
            passed = {k: None if v is None else (v >= t if op == ">=" else v <= t)
                      for k, (v, op, t) in checks.items()}
            ours_tok = [r["tokens"] for r in mine if r["arm"].startswith("ours")]
            og_tok = [r["tokens"] for r in mine if r["arm"].startswith("og")]
            pairs = [(a, b) for a in ours_tok for b in og_tok]
            workloads.append({
                "precision": prec, "prompt_len": plen, "best": best, "ratios": ratios,
                "targets": {k: [op, t] for k, (_, op, t) in checks.items()}, "pass": passed,
                "tokens_identical": bool(pairs) and all(a == b for a, b in pairs),
                "tokens_leading_match": min((leading_match(a, b) for a, b in pairs),
                                            default=None),
                "tokens_generated": len(ours_tok[0]) if ours_tok else None,
                "eos_in_tokens": any(0 in t for t in ours_tok + og_tok),
                "weights_bytes": wbytes, "weights_bytes_excl_embedding": wbytes - embed,
                "achieved_gb_s": {a: wbytes * v["decode_tok_s"] / 1e9 for a, v in best.items()},
                "measured_gb_s": measured})
    engines = sorted({r["engine"] for r in runs if "engine" in r})
    return {"workloads": workloads, "bandwidth": bandwidth, "engine_versions": engines,
            "prefix_cache_hits": sum(1 for r in runs if r.get("prefix_cache_hit_len"))}


def _f(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _pf(ok: bool | None) -> str:
    return "" if ok is None else ("pass" if ok else "FAIL")


def print_table(summary: dict[str, Any]) -> None:
    head = (f"{'prec':5}{'prompt':>7} | {'decode tok/s ours/og/og2/nospin/4k':>34} | "
            f"{'prefill tok/s ours/og':>22} | {'RSS MiB ours/og':>16} | "
            "GB/s ours/og [excl. embedding] / measured")
    print(head)
    print("-" * len(head))
    for w in summary["workloads"]:
        b = w["best"]
        dec = "/".join(_f(b.get(a, {}).get("decode_tok_s"), ".0f") for a in ARMS)
        pre = "/".join(_f(b.get(a, {}).get("prefill_tok_s"), ".0f") for a in ("ours", "og"))
        rss = "/".join(_f(b.get(a, {}).get("peak_rss_mib"), ".0f") for a in ("ours", "og"))
        gbs = "/".join(_f(w["achieved_gb_s"].get(a), ".1f") for a in ("ours", "og"))
        scale = w["weights_bytes_excl_embedding"] / w["weights_bytes"]
        gbx = "/".join(_f(w["achieved_gb_s"][a] * scale if a in b else None, ".1f")
                       for a in ("ours", "og"))
        print(f"{w['precision']:5}{w['prompt_len']:>7} | {dec:>34} | {pre:>22} | {rss:>16} | "
              f"{gbs} [{gbx}] / {_f(w['measured_gb_s'], '.1f')}")
    print()
    print(f"{'prec':5}{'prompt':>7} | {'decode ours/og':>20} | {'prefill ours/og':>19} | "
          f"{'RSS ours/og':>17} | {'og2/og dec,pre':>14} | {'nospin/ours dec,pre':>17} | "
          f"{'4k/ours dec':>11} | tokens")
    for w in summary["workloads"]:
        r, ok, t = w["ratios"], w["pass"], w["targets"]
        ctl = ",".join(_f(r[k], ".3f") for k in ("control_decode", "control_prefill"))
        noisy = any(r[k] is not None and abs(r[k] - 1) > CONTROL_TOLERANCE
                    for k in ("control_decode", "control_prefill"))
        spin = ",".join(_f(r[k], ".3f") for k in ("nospin_decode", "nospin_prefill"))
        toks = ("identical" if w["tokens_identical"] else
                f"lead {w['tokens_leading_match']}/{w['tokens_generated']}")
        print(f"{w['precision']:5}{w['prompt_len']:>7} | "
              f"{_f(r['decode'], '.3f'):>5} >={t['decode'][1]:.2f} {_pf(ok['decode']):>4} | "
              f"{_f(r['prefill'], '.3f'):>5} >={t['prefill'][1]:.2f} {_pf(ok['prefill']):>4} | "
              f"{_f(r['rss'], '.3f'):>5} <={t['rss'][1]:.2f} {_pf(ok['rss']):>4} | "
              f"{ctl + (' !' if noisy else ''):>14} | {spin:>17} | "
              f"{_f(r['small_pages_decode'], '.3f'):>11} | {toks}")
    for w in summary["workloads"]:
        if w["prompt_len"] == min(x["prompt_len"] for x in summary["workloads"]):
            print(f"{w['precision']} weights: {w['weights_bytes'] / 1e6:.0f} MB on disk, "
                  f"{w['weights_bytes_excl_embedding'] / 1e6:.0f} MB without the fp32 "
                  "embedding table (one row of it is read per token)")
    bw = summary["bandwidth"]
    if bw:
        best = {n: max(b["gb_s"] for b in bw if b["threads"] == n)
                for n in {b["threads"] for b in bw}}
        print("measured read bandwidth (ORT ReduceSum, 512 MiB), best: " +
              ", ".join(f"{n} thread(s) {v:.1f} GB/s" for n, v in sorted(best.items())) +
              "; every sample: " + " ".join(f"{b['gb_s']:.0f}" for b in bw))


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = summary["workloads"]
    labels = [f"{w['precision']}\n{w['prompt_len']} tok" for w in ws]
    panels = [("decode tok/s", "decode", "control_decode", "nospin_decode"),
              ("prefill tok/s", "prefill", "control_prefill", "nospin_prefill"),
              ("peak RSS (lower is better)", "rss", None, None)]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (title, key, ctl, spin) in zip(axes, panels, strict=True):
        series = [("ours/og", key, "tab:blue"), ("og2/og (control)", ctl, "tab:gray"),
                  ("ours-nospin/ours", spin, "tab:orange")]
        series = [s for s in series if s[1] is not None]
        width = 0.8 / len(series)
        for j, (name, k, color) in enumerate(series):
            xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(ws))]
            ax.bar(xs, [w["ratios"][k] or 0 for w in ws], width, label=name, color=color)
        for i, w in enumerate(ws):
            x0 = i - 0.4
            ax.hlines(w["targets"][key][1], x0, x0 + 0.8, colors="red",
                      label="target" if i == 0 else None)
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
        ax.set_xticks(range(len(ws)), labels)
        ax.set_title(title)
        ax.set_ylabel("ratio")
        ax.set_ylim(0, 1.5)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    built = spawn("build", "--out", str(args.out), "--precisions", ",".join(args.precisions))
    models = {p: Path(m) for p, m in built.items()}
    bandwidth = [spawn("bandwidth", "--threads", str(n)) for n in sorted({1, args.threads})]
    runs: list[dict[str, Any]] = []
    workloads = [(p, n) for p in args.precisions for n in args.prompt_lens]
    total = args.rounds * len(workloads) * len(args.arms)
    for rnd in range(args.rounds):
        # The VM shares memory bandwidth with its neighbours: sample it every round.
        bandwidth.append({"round": rnd, **spawn("bandwidth", "--threads", str(args.threads))})
        for w, (prec, plen) in enumerate(workloads):
            k = (rnd + w) % len(args.arms)
            for arm in args.arms[k:] + args.arms[:k]:
                res = spawn(arm, "--threads", str(args.threads), "--model", str(models[prec]),
                            "--prompt-len", str(plen), "--new-tokens", str(args.new_tokens))
                runs.append({"round": rnd, "arm": arm, "precision": prec, "prompt_len": plen,
                             "threads": args.threads, "new_tokens": args.new_tokens, **res})
                print(f"[{len(runs)}/{total}] r{rnd} {prec} p{plen} {arm:9} "
                      f"decode {res['decode_tok_s']:7.1f} tok/s  prefill "
                      f"{res['prefill_tok_s']:7.1f} tok/s  rss {res['peak_rss_mib']:.0f} MiB",
                      file=sys.stderr, flush=True)
    bandwidth += [spawn("bandwidth", "--threads", str(args.threads))]
    summary = summarize(runs, models, bandwidth, args.threads)
    summary["elapsed_s"] = time.time() - started
    summary["settings"] = {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items() if k not in ("worker", "model")}
    summary["spec"] = SPEC
    summary["models"] = {p: str(m) for p, m in models.items()}
    (args.out / "decode.json").write_text(json.dumps({"summary": summary, "runs": runs},
                                                     indent=1) + "\n")
    plot(summary, args.out / "decode.png")
    print_table(summary)
    if len(summary["engine_versions"]) > 1 or summary["prefix_cache_hits"]:
        print(f"WARNING: {len(summary['engine_versions'])} versions of engine/*.py ran (it "
              f"changed during the run); {summary['prefix_cache_hits']} timed runs hit the "
              "prefix cache", file=sys.stderr)
    print(f"elapsed {summary['elapsed_s']:.0f} s; wrote {args.out / 'decode.json'} and "
          f"{args.out / 'decode.png'}")
    bad = [w for w in summary["workloads"] if w["precision"] == "fp32"
           and {"ours", "og"} <= set(w["best"]) and not w["tokens_identical"]]
    for w in bad:
        print(f"ERROR: fp32 prompt {w['prompt_len']}: ours and og tokens differ "
              f"(leading match {w['tokens_leading_match']})", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
