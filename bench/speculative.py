"""Speculative decoding: prompt lookup vs plain greedy vs onnxruntime-genai, on an edit task.

The edit task: a held-out Python function (EDIT_SOURCES), then "the same function, with one name
changed" and its edited first line; the model writes the rest, which is mostly a copy of
the prompt. The no-overlap task: a short prompt whose answer shares nothing with it.
Arms (each in a fresh process, order rotated every round): `plain` (our engine, greedy),
`lookup` (our engine, greedy + prompt lookup), `auto` (our engine's default: prompt lookup
with pauses after failed guesses), `og` (onnxruntime-genai 0.18, greedy).

    python -m bench.speculative [--model fp32|int4|default-coder|DIR] [--rounds 3]
    python -m bench.speculative --agreement 24 --model int4   # speculation on vs off

Writes bench/out/speculative[-agreement]-<model>.json. See bench/README.md.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import re
import statistics
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _workers  # noqa: E402
from bench._fresh import run_worker  # noqa: E402

OUT = REPO / "bench" / "out"
ARMS = ("plain", "lookup", "auto", "og")
TASKS = ("edit", "novel")
#: The edit task's function: the longest of these whose prompt and rewrite fit the context.
#: None is in a training set we know of (tests/bench/test_peers.py checks it): standard-
#: library functions of files the default model's corpus holds out (its edit-tuning draws
#: functions from the train files only; an earlier list had argparse functions, which are
#: train files, and measured a rewrite the tuned model had learnt), and this repository's
#: own code, written after SmolLM2's pre-training data was collected.
EDIT_SOURCES = (("json.encoder", "JSONEncoder.iterencode"),  # 54 lines
                ("ipaddress", "summarize_address_range"),  # 53 lines
                ("bench._workers", "run_og"),  # 45 lines
                ("gzip", "GzipFile._write_gzip_header"),  # 31 lines
                ("ftplib", "FTP.retrbinary"))  # 25 lines
NOVEL_PROMPT = "# Return the n-th Fibonacci number, iteratively.\ndef fibonacci(n):\n"
AGREEMENT_MODULES = ("argparse", "textwrap", "shlex", "fractions", "difflib", "calendar",
                     "configparser", "csv", "pprint", "ipaddress", "statistics", "string")
TARGETS = {"edit_vs_plain": 2.0, "edit_vs_og": 2.0, "novel_vs_plain": 0.95}


def _function_source(module: str, qualname: str) -> str:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return textwrap.dedent(inspect.getsource(obj))


def edit_texts(source: str) -> tuple[str, str]:
    """(prompt, expected continuation): rename the first parameter (not self) everywhere."""
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    names = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
    old = names[0] if names else fn.name
    new = f"{old}_value"
    edited = re.sub(rf"\b{re.escape(old)}\b", new, source)
    head, _, rest = edited.partition("\n")
    prompt = (f"{source}\n\n# The same function, with `{old}` renamed to `{new}`:\n{head}\n")
    return prompt, rest


def task_prompt(tokenizer: Any, task: str, context: int,
                new_tokens: int) -> tuple[list[int], list[int], int]:
    """Prompt ids, the ids of the expected answer (none for the no-overlap task) and how
    many tokens to generate: the whole rewrite, at most `new_tokens`."""
    if task == "novel":
        ids = tokenizer.encode(NOVEL_PROMPT, parse_special=False)
        return ids, [], min(new_tokens, context - len(ids) - 1)
    for source in EDIT_SOURCES:
        prompt, expected = edit_texts(_function_source(*source))
        ids = tokenizer.encode(prompt, parse_special=False)
        answer = tokenizer.encode(expected, parse_special=False)
        n = min(new_tokens, len(answer))
        if len(ids) + n < context:
            return ids, answer, n
    raise SystemExit(f"no edit task fits a context of {context} tokens")


def agreement_sources() -> list[str]:
    """Stdlib functions of 15-80 lines, in a fixed order."""
    found: list[str] = []
    for module in AGREEMENT_MODULES:
        mod = __import__(module)
        for _, obj in sorted(inspect.getmembers(mod, inspect.isfunction)):
            if getattr(obj, "__module__", None) == module:
                src = textwrap.dedent(inspect.getsource(obj))
                if 15 <= len(src.splitlines()) <= 80:
                    found.append(src)
    return found


def worker(arm: str, model: Path, task: str, new_tokens: int, threads: int) -> dict[str, Any]:
    from engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(model)
    context = json.loads((model / "genai_config.json").read_text())["model"]["context_length"]
    prompt, expected, n = task_prompt(tok, task, context, new_tokens)
    warmup = _workers.prompt_ids(tok.vocab_size, _workers.WARMUP_PROMPT, 99)
    load = os.getloadavg()[0]
    if arm == "og":
        result = _workers.run_og(model, prompt, warmup, n, threads)
    else:
        mode = {"lookup": "prompt_lookup", "auto": "auto"}.get(arm, "none")
        result = _workers.run_ours(model, prompt, warmup, n, threads, spin=True,
                                   speculative_mode=mode)
    tokens = result["tokens"]
    match = next((i for i, (a, b) in enumerate(zip(tokens, expected, strict=False))
                  if a != b), min(len(tokens), len(expected)))
    return {"decode_tok_s": result["decode_tok_s"], "tokens": tokens,
            "speculation": result.get("speculation"), "prompt_tokens": len(prompt),
            "expected_match": match, "loadavg_1m": load}


def agreement_worker(model: Path, count: int, new_tokens: int, threads: int) -> dict[str, Any]:
    """Greedy with speculation on vs off over `count` edit prompts, in one process."""
    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest

    engine = Engine.load(model, EngineConfig(intra_op_threads=threads, prefix_cache=False))
    rows: list[dict[str, Any]] = []
    for source in agreement_sources():
        ids = engine.tokenizer.encode(edit_texts(source)[0], parse_special=False)
        if len(rows) == count or len(ids) + new_tokens >= engine.context_length:
            continue  # prompts that leave no room for the answer are skipped
        out = {}
        for mode in ("none", "prompt_lookup"):
            engine.runner.reset()  # both prefill the whole prompt the same way (no reuse)
            opts = GenerateOptions(temperature=0.0, stop_on_eos=False,
                                   max_new_tokens=new_tokens, speculative_mode=mode)
            out[mode] = engine.generate(GenerateRequest(token_ids=tuple(ids), options=opts))
        plain, fast = out["none"].token_ids, out["prompt_lookup"].token_ids
        lead = next((i for i, (a, b) in enumerate(zip(plain, fast, strict=False)) if a != b),
                    len(plain))
        stats = out["prompt_lookup"].speculation
        rows.append({"prompt_tokens": len(ids), "identical": plain == fast, "leading": lead,
                     "speculation": stats.as_dict() if stats else None})
    return {"rows": rows, "identical": sum(r["identical"] for r in rows), "prompts": len(rows),
            "new_tokens": new_tokens}


def _first_eos(tokens: list[int], eos: set[int]) -> int | None:
    return next((i for i, t in enumerate(tokens) if t in eos), None)


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    return tokens[:_first_eos(tokens, eos)]


def _stats(runs: list[dict[str, Any]], task: str, eos: set[int]) -> dict[str, Any]:
    mine = [r for r in runs if r["task"] == task]
    best = {a: max(r["decode_tok_s"] for r in mine if r["arm"] == a) for a in ARMS}
    med = {a: statistics.median(r["decode_tok_s"] for r in mine if r["arm"] == a)
           for a in ARMS}
    first = {a: next(r for r in mine if r["arm"] == a) for a in ARMS}
    # the proposer's own cost as a share of decode time: immune to the machine's noise
    share = statistics.median(r["speculation"]["propose_ms"] / 1e3 * r["decode_tok_s"]
                              / max(1, len(r["tokens"]) - 1)
                              for r in mine if r["arm"] == "lookup")
    # og runs to min_length = max_length, which masks EOS; our arms do not stop at EOS but
    # do not mask it: compare up to the first EOS our greedy answer has (og's tokens have
    # no EOS: cut them where ours has its first)
    ours = _until_eos(first["plain"]["tokens"], eos)
    return {
        "best_tok_s": best, "median_tok_s": med,
        "lookup_vs_plain": best["lookup"] / best["plain"],
        "auto_vs_plain": best["auto"] / best["plain"],
        "median_auto_vs_plain": med["auto"] / med["plain"],
        "lookup_vs_og": best["lookup"] / best["og"], "plain_vs_og": best["plain"] / best["og"],
        "median_lookup_vs_plain": med["lookup"] / med["plain"],
        "median_lookup_vs_og": med["lookup"] / med["og"],
        "speculation": first["lookup"]["speculation"], "propose_share": share,
        "tokens_identical": {
            "lookup=plain": all(r["tokens"] == first["plain"]["tokens"]
                                for r in mine if r["arm"] == "lookup"),
            "auto=plain": all(r["tokens"] == first["plain"]["tokens"]
                              for r in mine if r["arm"] == "auto"),
            "og=plain": all(r["tokens"][:len(ours)] == ours
                            for r in mine if r["arm"] == "og")},
        "plain_eos_at": _first_eos(first["plain"]["tokens"], eos),
        "expected_match_tokens": first["plain"]["expected_match"],
        "generated_tokens": len(first["plain"]["tokens"]),
        "prompt_tokens": first["plain"]["prompt_tokens"],
        "loadavg_1m": [round(r["loadavg_1m"], 2) for r in mine]}


def resolve_model(name: str) -> Path:
    if name in ("fp32", "int4"):
        from bench.decode import build_models

        return build_models(OUT, [name])[name]
    path = REPO / "tools" / "models" / "default-coder" if name == "default-coder" \
        else Path(name)
    if not (path / "genai_config.json").is_file():
        raise SystemExit(f"{path} is not an onnxruntime-genai model folder")
    return path


def task_lengths(args: argparse.Namespace, model: Path, eos: set[int]) -> dict[str, int]:
    """Tokens to generate per task: the edit is timed up to where our greedy rewrite ends
    (its first EOS, found by one plain run), so that what follows a finished rewrite (a
    model left running after EOS writes unrelated code) is not counted as editing; the
    novel task runs ``--new-tokens``."""
    lengths = {task: args.new_tokens for task in TASKS}
    probe = run_worker("bench.speculative", "--worker", "plain", "--model-dir", str(model),
                       "--task", "edit", "--new-tokens", str(args.new_tokens),
                       "--threads", str(args.threads))
    ends = _first_eos(probe["tokens"], eos)
    if ends:  # an answer that is EOS at once has nothing to time: keep the full length
        lengths["edit"] = ends
    return lengths


def run_comparison(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    from engine.model.model_dir import load_model_dir

    eos = set(load_model_dir(model).eos_token_ids)
    lengths = task_lengths(args, model, eos)
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        for t, task in enumerate(TASKS):
            k = (rnd + t) % len(ARMS)
            for arm in ARMS[k:] + ARMS[:k]:
                res = run_worker("bench.speculative", "--worker", arm, "--model-dir",
                                 str(model), "--task", task, "--new-tokens",
                                 str(lengths[task]), "--threads", str(args.threads))
                runs.append({"round": rnd, "task": task, "arm": arm, **res})
                spec = res["speculation"] or {}
                print(f"r{rnd} {task:5} {arm:6} {res['decode_tok_s']:7.1f} tok/s  load "
                      f"{res['loadavg_1m']:.1f}  accepted {spec.get('accepted', '-')}/"
                      f"{spec.get('proposed', '-')}", file=sys.stderr, flush=True)
    return {"tasks": {task: _stats(runs, task, eos) for task in TASKS}, "runs": runs,
            "lengths": lengths}


def print_summary(summary: dict[str, Any]) -> None:
    for task, s in summary["tasks"].items():
        b, m, sp = s["best_tok_s"], s["median_tok_s"], s["speculation"] or {}
        print(f"{task}: prompt {s['prompt_tokens']} tok, {s['generated_tokens']} generated; "
              f"best tok/s plain {b['plain']:.1f} / lookup {b['lookup']:.1f} / og {b['og']:.1f}"
              f" (median {m['plain']:.1f} / {m['lookup']:.1f} / {m['og']:.1f})")
        print(f"  lookup/plain {s['lookup_vs_plain']:.2f} "
              f"(median {s['median_lookup_vs_plain']:.2f}), "
              f"lookup/og {s['lookup_vs_og']:.2f} (median {s['median_lookup_vs_og']:.2f}), "
              f"plain/og {s['plain_vs_og']:.2f}, auto/plain {s['auto_vs_plain']:.2f} "
              f"(median {s['median_auto_vs_plain']:.2f})")
        print(f"  proposed {sp.get('proposed')}, accepted {sp.get('accepted')}, acceptance "
              f"{sp.get('acceptance_rate')}, tokens/forward {sp.get('tokens_per_forward')}, "
              f"proposer {100 * s['propose_share']:.2f}% of decode time; "
              f"identical {s['tokens_identical']}; answer tokens matching the expected edit "
              f"{s['expected_match_tokens']}; load avg {s['loadavg_1m']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="fp32", help="fp32, int4, default-coder or a folder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--agreement", type=int, default=0, help="prompts for on/off agreement")
    ap.add_argument("--worker", choices=(*ARMS, "agreement"))
    ap.add_argument("--model-dir", type=Path)
    ap.add_argument("--task", choices=TASKS)
    args = ap.parse_args(argv)
    if args.worker == "agreement":
        print(json.dumps(agreement_worker(args.model_dir, args.agreement, args.new_tokens,
                                          args.threads)))
        return 0
    if args.worker:
        print(json.dumps(worker(args.worker, args.model_dir, args.task, args.new_tokens,
                                args.threads)))
        return 0
    model = resolve_model(args.model)
    label = model.name if args.model not in ("fp32", "int4") else args.model
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if args.agreement:
        res = run_worker("bench.speculative", "--worker", "agreement", "--model-dir", str(model),
                         "--agreement", str(args.agreement), "--new-tokens",
                         str(args.new_tokens), "--threads", str(args.threads))
        (OUT / f"speculative-agreement-{label}.json").write_text(json.dumps(res, indent=1))
        accepted = sum((r["speculation"] or {}).get("accepted", 0) for r in res["rows"])
        print(f"{label}: {res['identical']}/{res['prompts']} prompts token-identical with "
              f"speculation on vs off ({res['new_tokens']} tokens each; leading matches "
              f"{[r['leading'] for r in res['rows']]}; {accepted} tokens accepted in all)")
        return 0
    summary = run_comparison(args, model)
    summary.update(model=str(model), elapsed_s=time.time() - started, targets=TARGETS,
                   settings={"rounds": args.rounds, "new_tokens": args.new_tokens,
                             "threads": args.threads})
    (OUT / f"speculative-{label}.json").write_text(json.dumps(summary, indent=1))
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
