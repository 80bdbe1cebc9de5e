"""Our engine's and onnxruntime-genai's side of bench/peers.py (one job per fresh process).

Decode and speculative jobs reuse `bench._workers` (the clock of bench.decode); this adds
the editor FIM after an edit (ours through the engine's prefix reuse, onnxruntime-genai
with `Generator.rewind_to` on one generator, so both keep the unchanged prefix) and the
4-stream aggregate (ours through the scheduler's batched step, onnxruntime-genai with a
batch of 4 in one generator).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import _workers
from bench._peer_llama import common_prefix

#: ours with the LM head run for every prompt row, as exported (EngineConfig.prune_logits
#: off): what computing the last row's logits only gains, in the same run
ALL_ROWS_ARM = "ours-rows"
#: onnxruntime-genai given our engine's thread spin (engine.config.SPIN_US) instead of
#: ONNX Runtime's own: what that setting alone gives og, in the same run
OG_SPIN_ARM = "og-spin"
#: ours with ONNX Runtime's GroupQueryAttention kernel throughout (EngineConfig.own_kernels
#: off, engine/kernels unused): what the engine's decode-attention kernel gains, same run
OURS_GQA_ARM = "ours-gqa"
#: The single arms, in the order the decode workload runs them
SINGLE_ARMS = (ALL_ROWS_ARM, OG_SPIN_ARM, OURS_GQA_ARM)


def ours_fim(model: Path, prompts: list[list[int]], new_tokens: int,
             threads: int, settle: bool = True, own_kernels: bool = True) -> dict[str, Any]:
    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest

    engine = Engine.load(model, EngineConfig(intra_op_threads=threads,
                                             own_kernels=own_kernels))
    # one token a step, as the peers decode
    opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=new_tokens,
                           speculative_mode="none")
    rows: list[dict[str, Any]] = []
    waited_ms = 0.0
    for ids in prompts:
        if len(rows) == 1 and settle:
            # The user reads the first completion before typing: the weights' huge-page
            # collapse runs in that pause (>= 0.5 s without a request). Edits typed
            # back to back right after a load run on 4 KiB pages (settle=False).
            start = time.perf_counter()
            engine.wait_huge_pages()
            waited_ms = (time.perf_counter() - start) * 1e3
        res = engine.generate(GenerateRequest(token_ids=tuple(ids), options=opts))
        rows.append({"ttft_ms": res.timings.ttft_ms, "prompt": len(ids),
                     "recomputed": len(ids) - res.prefix_cache_hit_len,
                     "tokens": list(res.token_ids)})
    return {"rows": rows, "huge_pages_wait_ms": waited_ms}


def _og_model(model: Path, threads: int) -> Any:
    import onnxruntime_genai as og

    config = og.Config(str(model))
    config.overlay(json.dumps(
        {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    return og.Model(config)


def og_fim(model: Path, prompts: list[list[int]], new_tokens: int,
           threads: int) -> dict[str, Any]:
    """One generator for the whole editing session: each request rewinds it to the prefix
    it shares with the new prompt (`rewind_to`) and appends only the rest."""
    import onnxruntime_genai as og

    og_model = _og_model(model, threads)
    params = og.GeneratorParams(og_model)
    params.set_search_options(max_length=max(map(len, prompts)) + new_tokens + 8,
                              do_sample=False)
    gen = og.Generator(og_model, params)
    rows = []
    held: list[int] = []
    for ids in prompts:
        start = time.perf_counter()
        keep = min(common_prefix(held, ids), len(ids) - 1)
        if keep < len(held):
            gen.rewind_to(keep)
        gen.append_tokens(np.asarray(ids[keep:], dtype=np.int32))
        gen.generate_next_token()
        ttft = (time.perf_counter() - start) * 1e3
        while len(gen.get_sequence(0)) < len(ids) + new_tokens and not gen.is_done():
            gen.generate_next_token()
        seq = [int(t) for t in gen.get_sequence(0)]
        held = seq
        rows.append({"ttft_ms": ttft, "prompt": len(ids), "recomputed": len(ids) - keep,
                     "tokens": seq[len(ids):]})
    return {"rows": rows}


def _ours_rates(engine: Any, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """`prompts` submitted together to the scheduler: the aggregate tok/s once every stream
    has its first token (``steady``, onnxruntime-genai's static batch window) and from the
    submission to the last token (``end_to_end``, the prompts' prefill included)."""
    from engine import GenerateOptions, GenerateRequest
    from engine.scheduling.scheduler import Scheduler

    scheduler = Scheduler(engine)
    stamps: list[tuple[int, float]] = []

    def sink_for(stream: int) -> Any:
        def sink(item: Any) -> None:
            if isinstance(item, BaseException):
                raise item
            if item.token_id is not None:
                stamps.append((stream, item.timestamp))
        return sink

    # one token a step, as the peers decode
    opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=new_tokens,
                           speculative_mode="none")
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        scheduler.submit(GenerateRequest(token_ids=tuple(ids), options=opts), sink_for(i))
    while scheduler.step():
        pass
    all_in = max(min(t for s, t in stamps if s == i) for i in range(len(prompts)))
    after = [t for _, t in stamps if t > all_in]
    last = max(t for _, t in stamps)
    return {"steady": len(after) / (last - all_in), "end_to_end": len(stamps) / (last - start)}


def ours_streams(model: Path, prompts: list[list[int]], new_tokens: int,
                 threads: int) -> dict[str, Any]:
    from engine import Engine, EngineConfig

    engine = Engine.load(model, EngineConfig(intra_op_threads=threads))
    engine.wait_huge_pages()
    _ours_rates(engine, [prompts[0][:8]], 8)  # warm-up
    one, many = _ours_rates(engine, prompts[:1], new_tokens), _ours_rates(engine, prompts,
                                                                          new_tokens)
    return {"one_tok_s": one["steady"], "many_tok_s": many["steady"],
            "one_e2e_tok_s": one["end_to_end"], "many_e2e_tok_s": many["end_to_end"],
            "streams": len(prompts)}


def _og_generate(og_model: Any, batch: list[list[int]], n: int) -> tuple[float, float, float]:
    """`n` greedy tokens after each prompt of `batch` (same length) in one onnxruntime-genai
    generator; perf_counter at the start, at the first token and at the last."""
    import onnxruntime_genai as og

    start = time.perf_counter()
    params = og.GeneratorParams(og_model)
    total = len(batch[0]) + n
    params.set_search_options(max_length=total, min_length=total, do_sample=False,
                              batch_size=len(batch))
    gen = og.Generator(og_model, params)
    gen.append_tokens(np.asarray(batch, dtype=np.int32))
    gen.generate_next_token()
    first = time.perf_counter()
    for _ in range(n - 1):
        gen.generate_next_token()
    return start, first, time.perf_counter()


def og_streams(model: Path, prompts: list[list[int]], new_tokens: int,
               threads: int) -> dict[str, Any]:
    """onnxruntime-genai's static batch: the prompts (same length) in one generator."""
    og_model = _og_model(model, threads)

    def rate(batch: list[list[int]], n: int) -> tuple[float, float]:
        """(tok/s after the first token, tok/s from the start, prefill included)."""
        start, first, end = _og_generate(og_model, batch, n)
        return len(batch) * (n - 1) / (end - first), len(batch) * n / (end - start)

    rate([prompts[0][:8]], 8)  # warm-up
    one, many = rate(prompts[:1], new_tokens), rate(prompts, new_tokens)
    return {"one_tok_s": one[0], "many_tok_s": many[0], "one_e2e_tok_s": one[1],
            "many_e2e_tok_s": many[1], "streams": len(prompts)}


def first_request(model: Path, ids: list[int], n: int, threads: int,
                  arm: str) -> dict[str, Any]:
    """The first request right after a load, as an app's first answer (no warm-up).
    ``first`` is the engine as shipped (the weights' huge-page collapse waits for a pause
    in the requests), ``first-4k`` has no huge pages, ``first-og`` is onnxruntime-genai."""
    t0 = time.perf_counter()
    if arm == "first-cli":
        return _cli_first(model, ids, n, threads)
    if arm == "first-og":
        og_model = _og_model(model, threads)
        load_ms = (time.perf_counter() - t0) * 1e3
        start, first, last = _og_generate(og_model, [ids], n)
        return {"ttft_ms": (first - start) * 1e3, "load_ms": load_ms,
                "decode_tok_s": (n - 1) / (last - first)}
    from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest

    engine = Engine.load(model, EngineConfig(intra_op_threads=threads,
                                             huge_pages=arm != "first-4k"))
    load_ms = (time.perf_counter() - t0) * 1e3
    # one token a step, as the peers decode
    opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=n,
                           speculative_mode="none")
    res = engine.generate(GenerateRequest(token_ids=tuple(ids), options=opts))
    return {"ttft_ms": res.timings.ttft_ms, "load_ms": load_ms,
            "decode_tok_s": res.timings.decode_tok_s,
            "collapse_done_after": engine.wait_huge_pages(0)}


def _cli_first(model: Path, ids: list[int], n: int, threads: int) -> dict[str, Any]:
    """``python -m engine generate --json`` in its own process, one token a step: its
    own timings, and the command's wall time from start to exit."""
    import subprocess

    cmd = [sys.executable, "-m", "engine", "generate", "--model", str(model),
           "--token-ids", ",".join(map(str, ids)), "--max-new-tokens", str(n),
           "--no-stop-on-eos", "--json", "--threads", str(threads), "--speculative", "none"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall_ms = (time.perf_counter() - t0) * 1e3
    timings = json.loads(done.stdout)["timings"]
    return {"ttft_ms": timings["ttft_ms"], "decode_tok_s": timings["decode_tok_s"],
            "command_ms": wall_ms}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """A job of bench.peers for the arms `ours` and `og` (their control arms alike)."""
    data = json.loads(Path(job["prompts"]).read_text())
    model, threads, kind = Path(job["model"]), int(job["threads"]), job["kind"]
    engine = job["engine"]
    if kind in ("decode", "spec"):
        if kind == "decode":
            ids, n = data["decode"][str(job["prompt_len"])], job["new_tokens"]
        else:
            ids, n = data["spec"][job["task"]]["ids"], data["spec"][job["task"]]["n"]
        if engine == "og":
            from engine.config import SPIN_US

            out = _workers.run_og(model, ids, data["warmup"], n, threads,
                                  idle_s=job.get("idle_s", 0.0),
                                  spin_us=SPIN_US if job["arm"] == OG_SPIN_ARM else None)
        else:
            mode = "prompt_lookup" if job.get("lookup") else "none"
            out = _workers.run_ours(model, ids, data["warmup"], n, threads, spin=True,
                                    speculative_mode=mode, idle_s=job.get("idle_s", 0.0),
                                    prune_logits=job["arm"] != ALL_ROWS_ARM,
                                    own_kernels=job["arm"] != OURS_GQA_ARM)
    elif kind == "first":
        out = first_request(model, data["decode"][str(job["prompt_len"])], 32, threads,
                            job["arm"])
    elif kind == "fim":
        if engine == "ours":
            out = ours_fim(model, data["fim"], job["new_tokens"], threads,
                           own_kernels=job["arm"] != OURS_GQA_ARM)
        else:
            out = og_fim(model, data["fim"], job["new_tokens"], threads)
    elif engine == "ours":
        out = ours_streams(model, data["streams"], job["new_tokens"], threads)
    else:
        out = og_streams(model, data["streams"], job["new_tokens"], threads)
    out["peak_rss_mib"] = _workers.proc_status_mib().get("vm_hwm_mib")
    from engine.runtime.hugepages import anon_huge_bytes

    out["anon_huge_mib"] = round(anon_huge_bytes() / 2**20)  # on huge pages at the end
    return out
