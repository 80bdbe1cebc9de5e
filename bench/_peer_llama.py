"""llama.cpp's side of bench/peers.py, run by the bench-only `.venv-peers` interpreter.

llama-cpp-python 0.3.36 (`../shared/wheels/`) on the GGUF the built-in model was exported
from. Never imported by the app, its tests or our engine's workers. The same clock as
`bench._workers`: TTFT from the call until the first token is known, decode tok/s = tokens
after the first / time from the first token to the last. Greedy (`top_k=1, temp=0`), EOS
not special (`Llama.generate` does not stop at it), 2 threads for prompt and decode.

`Llama.generate` keeps the KV of the longest common prefix of the previous sequence and
the new prompt and evaluates only the rest: that is llama.cpp's same-context prompt
cache (the server's `cache_prompt`), used as is by the FIM workload.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._workers import WARMUP_NEW, idle_cpu, proc_status_mib


def load(gguf: Path, n_ctx: int, threads: int, lookup: int = 0) -> Any:
    from llama_cpp import Llama

    draft = None
    if lookup:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup)
    return Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads,
                 n_threads_batch=threads, n_batch=512, verbose=False, draft_model=draft,
                 logits_all=bool(lookup))  # a lookup verify reads every row


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def timed(llm: Any, ids: list[int], n: int) -> dict[str, Any]:
    """One greedy generation of `n` tokens after `ids`; llama.cpp reuses what it can of
    the previous sequence's KV (`recomputed` = prompt tokens it evaluated)."""
    held = common_prefix(list(llm._input_ids[:llm.n_tokens]), ids)
    recomputed = len(ids) - (held if held < len(ids) else len(ids) - 1)
    tokens: list[int] = []
    start = time.perf_counter()
    first = start
    for token in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
        if not tokens:
            first = time.perf_counter()
        tokens.append(int(token))
        if len(tokens) == n:
            break
    last = time.perf_counter()
    ttft = first - start
    return {"ttft_ms": ttft * 1e3, "prefill_tok_s": len(ids) / ttft,
            "decode_tok_s": (n - 1) / (last - first) if n > 1 and last > first else 0.0,
            "wall_ms": (last - start) * 1e3, "recomputed": recomputed, "tokens": tokens}


def run_decode(gguf: Path, prompt: list[int], warmup: list[int], new_tokens: int,
               threads: int, n_ctx: int, lookup: int = 0, idle_s: float = 0.0
               ) -> dict[str, Any]:
    t0 = time.perf_counter()
    llm = load(gguf, n_ctx, threads, lookup)
    load_ms = (time.perf_counter() - t0) * 1e3
    first_ttft_ms = timed(llm, warmup, WARMUP_NEW)["ttft_ms"]
    llm.reset()  # no prefix of the warm-up is reused
    out = timed(llm, prompt, new_tokens)
    out.update(load_ms=load_ms, first_ttft_ms=first_ttft_ms, idle_cpu=idle_cpu(idle_s))
    out.update({f"live_{k}": v for k, v in proc_status_mib().items()})
    return out


def run_fim(gguf: Path, prompts: list[list[int]], new_tokens: int, threads: int,
            n_ctx: int) -> dict[str, Any]:
    llm = load(gguf, n_ctx, threads)
    rows = []
    for ids in prompts:
        r = timed(llm, ids, new_tokens)
        rows.append({"ttft_ms": r["ttft_ms"], "recomputed": r["recomputed"],
                     "prompt": len(ids), "tokens": r["tokens"]})
    return {"rows": rows}


def _stream(url: str, prompt: str, max_tokens: int, stamps: list[float]) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "top_k": 1,
            "stream": True, "logit_bias": {"2": -100.0}}  # no EOS: every stream runs full
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as reply:
        for raw in reply:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                stamps.append(time.perf_counter())


def run_streams(gguf: Path, prompts: list[str], new_tokens: int, threads: int,
                port: int) -> dict[str, Any]:
    """llama-cpp-python's server (it runs one request at a time: its binding has no
    parallel slots); aggregate tokens/s of len(prompts) concurrent streams and of one."""
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
                             "--n_threads", str(threads), "--n_threads_batch", str(threads),
                             "--n_ctx", "2048", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("llama_cpp.server did not start") from None
                time.sleep(0.2)
        _stream(url, "def warm_up():", 8, [])
        rates, e2e = {}, {}
        for count in (1, len(prompts)):
            stamps: list[float] = []
            start = time.perf_counter()
            threads_ = [threading.Thread(target=_stream, args=(url, p, new_tokens, stamps))
                        for p in prompts[:count]]
            for t in threads_:
                t.start()
            for t in threads_:
                t.join()
            rates[count] = (len(stamps) - count) / (max(stamps) - min(stamps))
            e2e[count] = len(stamps) / (max(stamps) - start)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"one_tok_s": rates[1], "many_tok_s": rates[len(prompts)], "one_e2e_tok_s": e2e[1],
            "many_e2e_tok_s": e2e[len(prompts)], "streams": len(prompts)}


def main() -> None:
    job = json.loads(sys.argv[1])
    data = json.loads(Path(job["prompts"]).read_text())
    gguf, threads = Path(job["gguf"]), int(job["threads"])
    kind = job["kind"]
    if kind == "decode":
        out = run_decode(gguf, data["decode"][str(job["prompt_len"])], data["warmup"],
                         job["new_tokens"], threads, data["n_ctx"], idle_s=job["idle_s"])
    elif kind == "spec":
        task = data["spec"][job["task"]]
        out = run_decode(gguf, task["ids"], data["warmup"], task["n"], threads,
                         data["n_ctx"], lookup=job.get("lookup", 0))
    elif kind == "first":  # the first request right after a load, no warm-up
        t0 = time.perf_counter()
        llm = load(gguf, data["n_ctx"], threads)
        load_ms = (time.perf_counter() - t0) * 1e3
        out = timed(llm, data["decode"][str(job["prompt_len"])], 32)
        out["load_ms"] = load_ms
    elif kind == "fim":
        out = run_fim(gguf, data["fim"], job["new_tokens"], threads, data["n_ctx"])
    else:
        with socket.socket() as probe:  # a free port for the server
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        out = run_streams(gguf, data["stream_texts"], job["new_tokens"], threads, port)
    out["peak_rss_mib"] = proc_status_mib().get("vm_hwm_mib")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
