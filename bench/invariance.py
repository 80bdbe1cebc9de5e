"""The same request, every path through the engine: identical answers, or where they part.

A greedy request (48 new tokens, the chosen token's log-probability kept) is run on each
model along every path the engine can take, and compared with the plain path (a fresh
engine, the prompt prefilled whole, no speculation):

- ``repeat``: the same engine again: the prompt's KV comes from the prefix cache, its last
  token runs as a one-token step instead of inside the prefill;
- ``batch4``: decoded in one batch with three other requests (the scheduler, max_batch 4);
- ``chunk1`` / ``chunk7`` / ``chunk64``: the prompt prefilled in chunks of 1, 7, 64 tokens;
- ``lookup``: prompt-lookup speculation (drafts checked in one multi-token run);
- ``draft``: draft-model speculation, the model as its own draft.

A cell says ``identical`` (tokens and log-probabilities, bit for bit; tokens only for the
speculative paths, which run only where a step is asked for nothing but its argmax),
``token N`` (the first generated token that differs), or ``logprob N`` (same tokens, the
first log-probability whose bits differ). Prompts are this repository's own text (held out
of any training set).

    .venv/bin/python -m bench.invariance --model builtin=resources/models/smollm2-135m-instruct \\
        [--model NAME=DIR ...] [--paths repeat,batch4,...] [--new 48] [--kv-dtype float32]

Writes bench/out/invariance.json and prints the matrix (rows: paths; columns: models).
``bench.same_answer`` is its companion for models built in code (forged int4 layouts and
GGUF quantizations), with columns per kernel choice (the engine's, ONNX Runtime's).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUT = REPO / "bench" / "out"
PATHS = ("repeat", "batch4", "chunk1", "chunk7", "chunk64", "lookup", "draft")
#: (file, first character, characters): held-out text the prompts are cut from.
SOURCES = (("engine/README.md", 0, 1400), ("engine/kv/reuse.py", 0, 1400),
           ("docs/models.md", 400, 1200))
Answer = tuple[tuple[int, ...], tuple[float, ...]]


def _prompts() -> list[str]:
    return [(REPO / f).read_text(encoding="utf-8")[start:start + n] for f, start, n in SOURCES]


def _request(prompt: str, new: int, mode: str = "none") -> Any:
    """Greedy, `new` tokens; log-probabilities kept, except with speculation (which runs
    only where nothing but the argmax is asked of a step)."""
    from engine import GenerateOptions, GenerateRequest

    return GenerateRequest(prompt=prompt, options=GenerateOptions(
        max_new_tokens=new, temperature=0.0, stop_on_eos=False,
        top_logprobs=None if mode != "none" else 1, speculative_mode=mode))


def _speculated(result: Any) -> Answer:
    stats = result.speculation
    assert stats is not None and stats.proposed > 0, "speculation did not run"
    return tuple(result.token_ids), ()


def _answer(result: Any) -> Answer:
    return tuple(result.token_ids), tuple(lp.logprob for lp in result.logprobs)


#: EngineConfig.kv_dtype of every engine (--kv-dtype).
KV_DTYPE = {"value": "auto"}


def _engine(folder: Path, **config: Any) -> Any:
    from engine import Engine, EngineConfig

    return Engine.load(folder, EngineConfig(intra_op_threads=2, kv_dtype=KV_DTYPE["value"],
                                            **config))


def _batch4(folder: Path, prompts: list[str], i: int, new: int) -> Answer:
    from engine.scheduling.scheduler import Scheduler

    engine = _engine(folder, max_batch=4)
    scheduler = Scheduler(engine)
    results: dict[int, Any] = {}
    others = [p for j, p in enumerate(prompts) if j != i]
    batch = [prompts[i], *others, others[0][::-1]][:4]  # four requests, the target first

    def sink(j: int) -> Callable[[Any], None]:
        return lambda item: results.__setitem__(j, item)

    for j, prompt in enumerate(batch):
        scheduler.submit(_request(prompt, new), sink(j))
    while scheduler.step():
        pass
    return _answer(results[0].result)


def run_path(path: str, folder: Path, prompts: list[str], new: int) -> list[Answer]:
    if path == "plain":
        return [_answer(_engine(folder).generate(_request(p, new))) for p in prompts]
    if path == "repeat":
        engine = _engine(folder)
        out = []
        for p in prompts:
            engine.generate(_request(p, new))
            again = engine.generate(_request(p, new))
            assert again.prefix_cache_hit_len > 0, "the repeat did not reuse the prompt's KV"
            out.append(_answer(again))
        return out
    if path == "batch4":
        return [_batch4(folder, prompts, i, new) for i in range(len(prompts))]
    if path.startswith("chunk"):
        size = int(path.removeprefix("chunk"))
        return [_answer(_engine(folder, prefill_chunk_size=size).generate(_request(p, new)))
                for p in prompts]
    if path == "lookup":
        return [_speculated(_engine(folder).generate(_request(p, new, "prompt_lookup")))
                for p in prompts]
    if path == "draft":
        return [_speculated(_engine(folder, draft_model=str(folder)).generate(
            _request(p, new, "draft_model"))) for p in prompts]
    raise ValueError(f"unknown path {path!r}")


def compare(want: list[Answer], got: list[Answer]) -> str:
    """'identical', or the earliest 'token N' / 'logprob N' over the prompts."""
    first_token = first_logprob = None
    for (wt, wl), (gt, gl) in zip(want, got, strict=True):
        for n, (ta, tb) in enumerate(zip(wt, gt, strict=False)):
            if ta != tb:
                first_token = n if first_token is None else min(first_token, n)
                break
        else:
            for n, (la, lb) in enumerate(zip(wl, gl, strict=False)):
                if la != lb:
                    first_logprob = n if first_logprob is None else min(first_logprob, n)
                    break
    if first_token is not None:
        return f"token {first_token}"
    return "identical" if first_logprob is None else f"logprob {first_logprob}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--kv-dtype", choices=("auto", "float16", "float32", "int8", "int16"),
                   default="auto",
                   help="the KV cache's element type (EngineConfig.kv_dtype; default auto: "
                        "16 bits where the engine's kernel runs attention)")
    args = p.parse_args()
    KV_DTYPE["value"] = args.kv_dtype
    models = dict(m.split("=", 1) for m in args.model)
    paths = [x for x in args.paths.split(",") if x]
    prompts = _prompts()
    table: dict[str, dict[str, str]] = {}
    for name, folder in models.items():
        want = run_path("plain", Path(folder), prompts, args.new)
        for path in paths:
            table.setdefault(path, {})[name] = compare(
                want, run_path(path, Path(folder), prompts, args.new))
            print(f"{name} {path}: {table[path][name]}", flush=True)
    names = list(models)
    print("\n| path | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for path in paths:
        print(f"| {path} | " + " | ".join(table[path][n] for n in names) + " |")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "invariance.json").write_text(json.dumps(
        {"models": models, "new": args.new, "kv_dtype": args.kv_dtype, "table": table},
        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
