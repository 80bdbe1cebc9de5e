"""Evaluate the default code model on held-out standard-library files (no PyTorch needed).

    .venv/bin/python -m tools.eval_default_model [--model DIR] [--holes 300] [--json-out F]

Reports per-token perplexity of the model vs a unigram fitted on the training files, the
exact-match rate of single-line FIM holes through the engine's FIM path (PSM and SPM), and
a few sample generations (plain completion, FIM, chat).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tokenizers import Tokenizer  # noqa: E402

from engine import ChatMessage, Engine, EngineConfig, GenerateOptions, GenerateRequest  # noqa: E402
from tools.default_model.card import render_card  # noqa: E402
from tools.default_model.corpus import load_corpus  # noqa: E402
from tools.default_model.evaluate import fim_exact_match, fim_holes, perplexity  # noqa: E402

DEFAULT_MODEL = ROOT / "tools" / "models" / "default-coder"


def samples(model_dir: Path, threads: int) -> dict[str, str]:
    """Greedy sample outputs for the model card."""
    engine = Engine.load(model_dir, EngineConfig(intra_op_threads=threads))
    greedy = GenerateOptions(max_new_tokens=64, temperature=0.0)
    try:
        plain = engine.generate(GenerateRequest(prompt="def fib(n):", options=greedy)).text
        line = GenerateOptions(max_new_tokens=24, temperature=0.0, stop_sequences=("\n",))
        prefix = "def total(items):\n    s = 0\n    for i in range("
        suffix = "\n        s += items[i]\n    return s\n"
        fim_psm = engine.generate(engine.fim_request(prefix, suffix, line)).text
        fim_spm = engine.generate(engine.fim_request(prefix, suffix, line, order="spm")).text
        chat = engine.generate(GenerateRequest(messages=(ChatMessage(
            "user", "Write a Python function `is_even(n)`: Return True if n is even."),),
            options=GenerateOptions(max_new_tokens=96, temperature=0.0))).text
    finally:
        engine.close()
    return {"generate `def fib(n):`": plain,
            "FIM (psm) `for i in range(` in `total(items)`": fim_psm,
            "FIM (spm) `for i in range(` in `total(items)`": fim_spm,
            "chat `is_even(n)`": chat}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--holes", type=int, default=300)
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json-out", type=Path)
    p.add_argument("--show", type=int, default=0, help="print this many FIM holes")
    p.add_argument("--orders", default="psm,spm,none",
                   help="FIM layouts to score: psm, spm, none (the prefix as a plain prompt) "
                   "and auto (the model's own layout: prefix-only without FIM tokens)")
    p.add_argument("--no-samples", action="store_true", help="skip the sample generations")
    p.add_argument("--no-ppl", action="store_true",
                   help="skip perplexity (windows of the whole context: slow on a long one)")
    p.add_argument("--card", action="store_true",
                   help="write MODEL_CARD.md (and eval.json) into the model folder")
    args = p.parse_args(argv)
    began = time.time()
    corpus = load_corpus()
    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    decoder = json.loads((args.model / "genai_config.json").read_text())["model"]
    holes = fim_holes(tok, corpus.heldout, args.holes, args.seed)
    report: dict[str, object] = {"heldout_files": len(corpus.heldout)}
    if not args.no_ppl:
        ppl = perplexity(args.model, tok, corpus.train, corpus.heldout,
                         int(decoder["context_length"]), int(decoder["decoder"]["head_size"]),
                         args.threads)
        report.update({"heldout_tokens": ppl.tokens, "model_ppl": round(ppl.model_ppl, 2),
                       "unigram_ppl": round(ppl.unigram_ppl, 2),
                       "unigram_over_model": round(ppl.ratio, 2)})
    for order in args.orders.split(","):
        result = fim_exact_match(args.model, holes, order, threads=args.threads)
        code_exact, code_n = result.by_kind("code")
        key = {"none": "next_line", "auto": "fim_auto"}.get(order, f"fim_{order}")
        report[key] = {"n": result.n, "exact": result.exact, "rate": round(result.rate, 4),
                       "code_n": code_n, "code_exact": code_exact,
                       "code_rate": round(code_exact / max(1, code_n), 4)}
        if order == args.orders.split(",")[0]:
            for hole, got, ok in result.per_hole[: args.show]:
                print(f"{'OK ' if ok else 'BAD'} {hole.line!r} -> {got!r}")
    if not args.no_samples:
        report["samples"] = samples(args.model, args.threads)
    report["eval_s"] = round(time.time() - began, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    if args.card:
        training = json.loads((args.model / "training.json").read_text())
        (args.model / "eval.json").write_text(text + "\n")
        (args.model / "MODEL_CARD.md").write_text(render_card(training, report),
                                                  encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
