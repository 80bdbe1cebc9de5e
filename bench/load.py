"""Load benchmark of the worker: N concurrent streaming clients for a fixed time on loopback.

Run from the repository root:  .venv/bin/python -m bench.load  (16 clients, 60 s).
Starts `python -m engine serve` in its own process (or uses --url), then every client
loops until the time is up: a streaming request (rotating over OpenAI chat, OpenAI
completions with suffix, llama.cpp /completion and /infill, Ollama /api/generate), read to
the end. The loop is bounded: no new request starts after --seconds, and the whole run is
cut at --seconds + 60. Any non-200 answer, error event, or exception counts as an error;
the exit code is 1 when there was one. Writes bench/out/load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUT = REPO / "bench" / "out"
#: The default model: big enough that the engine, not HTTP, sets the pace (~7 ms a token
#: on 2 cores), small enough to build in a second.
SPEC = {"context": 1024, "hidden": 512, "layers": 8, "intermediate": 1536, "heads": 8,
        "kv_heads": 2}
PREFIX = "def area(r):\n    return "
SUFFIX = "\n\nprint(area(2))\n"


@dataclass
class Stats:
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    ttft_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--model", type=Path, help="model folder (default: a forged one)")
    p.add_argument("--url", help="use a running worker instead of starting one")
    p.add_argument("--api-key", help="the running worker's --api-key")
    p.add_argument("--threads", type=int, default=2, help="the worker's intra-op threads")
    p.add_argument("--spin-us", type=int, help="the worker's --spin-us (default: its own)")
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def default_model() -> Path:
    from tests.forge import ForgeSpec, write_genai_model

    folder = OUT / "models" / "load-qwen-coder-L8-H512"
    if not (folder / "model.onnx").is_file():
        write_genai_model(folder, ForgeSpec(**SPEC))  # type: ignore[arg-type]
    return folder


def start_worker(model: Path, threads: int, out: Path,
                 spin_us: int | None = None) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0",
           "--threads", str(threads), "--admin-token-file", str(out / "load-admin-token"),
           *(["--spin-us", str(spin_us)] if spin_us is not None else [])]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the worker did not start (exit {proc.wait()})")
    return proc, json.loads(line)["url"]


def requests_for(max_tokens: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, path, body): each a streaming request of about max_tokens tokens."""
    return [
        ("sse", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Write a function that adds."}],
            "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}),
        ("sse", "/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX,
                                    "max_tokens": max_tokens, "stream": True}),
        ("sse", "/completion", {"prompt": "import os\n", "n_predict": max_tokens,
                                "stream": True}),
        ("sse", "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX,
                            "n_predict": max_tokens, "stream": True}),
        ("ndjson", "/api/generate", {"prompt": PREFIX, "suffix": SUFFIX,
                                     "options": {"num_predict": max_tokens}}),
    ]


async def one_request(http: httpx.AsyncClient, kind: str, path: str, body: dict[str, Any],
                      stats: Stats) -> None:
    start = time.perf_counter()
    first: float | None = None
    async with http.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {response.status_code} {await response.aread()!r}")
        async for line in response.aiter_lines():
            if not line.strip():
                continue
            payload = line[6:] if kind == "sse" and line.startswith("data: ") else line
            if payload == "[DONE]":
                continue
            event = json.loads(payload)
            if isinstance(event, dict) and "error" in event:
                raise RuntimeError(f"{path}: error event {event['error']}")
            if first is None:
                first = time.perf_counter() - start
            stats.chunks += 1
    stats.ttft_s.append(first if first is not None else time.perf_counter() - start)
    stats.latency_s.append(time.perf_counter() - start)


async def client(index: int, url: str, headers: dict[str, str], deadline: float,
                 max_tokens: int, stats: Stats) -> None:
    plan = requests_for(max_tokens)
    turn = index
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        while time.monotonic() < deadline:
            kind, path, body = plan[turn % len(plan)]
            turn += 1
            stats.requests += 1
            try:
                await one_request(http, kind, path, body, stats)
            except Exception as exc:
                stats.errors += 1
                if len(stats.error_samples) < 10:
                    stats.error_samples.append(f"{type(exc).__name__}: {exc}")


def completion_tokens(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("engine_completion_tokens_total "):
            return float(line.split()[1])
    return 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        before = completion_tokens((await http.get("/metrics")).text)
        stats = Stats()
        started = time.monotonic()
        tasks = [client(i, url, headers, started + args.seconds, args.max_tokens, stats)
                 for i in range(args.clients)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=args.seconds + 60)
        elapsed = time.monotonic() - started
        after = completion_tokens((await http.get("/metrics")).text)
    tokens = after - before
    return {
        "clients": args.clients, "seconds": round(elapsed, 2), "requests": stats.requests,
        "errors": stats.errors, "error_samples": stats.error_samples,
        "tokens_generated": int(tokens), "tokens_per_s": round(tokens / elapsed, 1),
        "requests_per_s": round(stats.requests / elapsed, 2), "chunks": stats.chunks,
        "ttft_ms": {"p50": round(statistics.median(stats.ttft_s) * 1e3, 1) if stats.ttft_s
                    else 0.0, "p95": round(_pct(stats.ttft_s, 0.95) * 1e3, 1)},
        "latency_ms": {"p50": round(statistics.median(stats.latency_s) * 1e3, 1)
                       if stats.latency_s else 0.0,
                       "p95": round(_pct(stats.latency_s, 0.95) * 1e3, 1)},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    args.out.mkdir(parents=True, exist_ok=True)
    proc = None
    url = args.url
    model = None
    if url is None:
        model = args.model or default_model()
        proc, url = start_worker(model, args.threads, args.out, args.spin_us)
    try:
        report = asyncio.run(run(args, url))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    report.update({"url": url, "model": str(model) if model else None,
                   "max_tokens": args.max_tokens, "worker_threads": args.threads})
    (args.out / "load.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
