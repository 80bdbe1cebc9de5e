"""An imported GGUF against llama.cpp on the GGUF itself: teacher-forced next-token agreement
and perplexity over held-out text.

    python -m bench.gguf_agreement --gguf FILE.gguf --model IMPORTED_DIR \\
        [--control BUILDER_EXPORT_DIR] [--tokens 2000] [--peers-python .venv-peers/bin/python]

The text is this repository's own README and docs (written in 2026, after the models'
training), tokenized once with the imported folder's ``tokenizer.json``; every arm scores the
same token ids, each in a fresh process: ours through the engine's decode runner (prefill in
chunks, all logits), llama.cpp through llama-cpp-python (``logits_all``), in the bench venv
``.venv-peers`` (``../shared/wheels/README.md``; never a dependency of the app). An arm saves
per position the argmax and the log-probability of the true next token; the report gives
top-1 agreement with llama.cpp and each arm's perplexity. ``--control`` adds a second ONNX
folder (the builder's export of the same model) as a control arm.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TEXT_FILES = ("README.md", "docs/INSTALL.md", "docs/llamacpp-fields.md")
CHUNK = 256


def held_out_ids(model_dir: Path, n_tokens: int) -> tuple[list[int], str]:
    from tokenizers import Tokenizer

    text = "\n\n".join((REPO / f).read_text() for f in TEXT_FILES)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids: list[int] = tok.encode(text, add_special_tokens=False).ids[:n_tokens]
    return ids, tok.decode(ids)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _stats(logits: np.ndarray, ids: list[int]) -> dict[str, list[float] | list[int]]:
    """Per position t < n-1: argmax, log p(ids[t+1]) and the top-2 log-probability margin."""
    lp = _log_softmax(logits[:-1])
    nxt = np.array(ids[1:])
    top2 = np.sort(lp, axis=-1)[:, -2:]
    return {"argmax": logits[:-1].argmax(-1).tolist(),
            "logp": lp[np.arange(len(nxt)), nxt].tolist(),
            "margin": (top2[:, 1] - top2[:, 0]).tolist()}


def arm_ours(model: str, ids: list[int]) -> dict[str, object]:
    from engine.config import EngineConfig
    from engine.engine import Engine

    engine = Engine.load(model, EngineConfig())
    start = time.perf_counter()
    rows = []
    for at in range(0, len(ids), CHUNK):
        chunk = np.array(ids[at:at + CHUNK], np.int64)
        rows.append(engine.runner.forward(chunk, all_logits=True).copy())
    seconds = time.perf_counter() - start
    engine.close()
    return {**_stats(np.concatenate(rows), ids), "seconds": seconds}


def arm_llama(gguf: str, ids: list[int], text: str) -> dict[str, object]:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=len(ids) + 16, n_batch=CHUNK, logits_all=True,
                verbose=False)
    own = llm.tokenize(text.encode(), add_bos=False, special=False)
    start = time.perf_counter()
    llm.eval(ids)
    seconds = time.perf_counter() - start
    logits = np.array(llm.scores[: len(ids)], np.float32)
    return {**_stats(logits, ids), "seconds": seconds,
            "same_tokenization": own == ids, "llama_tokens": len(own)}


def _worker(args: argparse.Namespace) -> None:
    ids = json.loads(Path(args.ids).read_text())
    if args.worker == "ours":
        out = arm_ours(args.model, ids["ids"])
    else:
        out = arm_llama(args.gguf, ids["ids"], ids["text"])
    Path(args.out).write_text(json.dumps(out))


def _spawn(python: str, out: Path, *args: str) -> dict[str, object]:
    subprocess.run([python, "-m", "bench.gguf_agreement", *args, "--out", str(out)],
                   cwd=REPO, check=True, timeout=3600)
    result: dict[str, object] = json.loads(out.read_text())
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", required=True)
    p.add_argument("--model", help="the imported folder")
    p.add_argument("--control", help="another ONNX folder of the same model (control arm)")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--peers-python", default=str(REPO / ".venv-peers/bin/python"))
    p.add_argument("--work", default=str(REPO / "bench/out/gguf_agreement"))
    p.add_argument("--worker", choices=("ours", "llama"), help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ids, text = held_out_ids(Path(args.model), args.tokens)
    ids_file = work / "ids.json"
    ids_file.write_text(json.dumps({"ids": ids, "text": text}))
    arms = {"llama.cpp": _spawn(args.peers_python, work / "llama.json", "--worker", "llama",
                                "--gguf", args.gguf, "--ids", str(ids_file))}
    arms["imported"] = _spawn(sys.executable, work / "ours.json", "--worker", "ours", "--gguf",
                              args.gguf, "--model", args.model, "--ids", str(ids_file))
    if args.control:
        arms["control"] = _spawn(sys.executable, work / "control.json", "--worker", "ours",
                                 "--gguf", args.gguf, "--model", args.control,
                                 "--ids", str(ids_file))
    ref = np.array(arms["llama.cpp"]["argmax"])
    margin = np.array(arms["llama.cpp"]["margin"])
    report: dict[str, object] = {"tokens": len(ids), "positions": len(ref),
                                 "same_tokenization_as_llama_cpp":
                                     arms["llama.cpp"]["same_tokenization"]}
    for name, arm in arms.items():
        logp = np.array(arm["logp"])
        differ = np.array(arm["argmax"]) != ref
        report[name] = {
            "top1_agreement_with_llama_cpp": float(1 - differ.mean()),
            # where they part: how close llama.cpp's own best two were (log-probability)
            "llama_cpp_margin_where_they_differ": {
                "median": float(np.median(margin[differ])) if differ.any() else None,
                "max": float(margin[differ].max()) if differ.any() else None,
                "share_under_0.5": float((margin[differ] < 0.5).mean()) if differ.any()
                else None},
            "perplexity": float(np.exp(-logp.mean())),
            "seconds": round(float(arm["seconds"]), 2)}  # type: ignore[arg-type]
    base = report["llama.cpp"]["perplexity"]  # type: ignore[index]
    for name in arms:
        entry = report[name]
        entry["perplexity_vs_llama_cpp"] = entry["perplexity"] / base - 1  # type: ignore[index]
    (work / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
