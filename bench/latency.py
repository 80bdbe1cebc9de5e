"""Latencies a user notices, each with its goal: what the tests used to bound by the wall
clock (a busy machine failed them; the tests now check the behaviour and the order of
events, and this script the speed).

- ``worker_back_s``: the app's worker killed (SIGKILL) until a new one is ready with the
  same model (``app.worker.WorkerProcess``); goal < 3 s.
- ``store_update_ms``: the median time to save a streaming answer's text once more, in a
  conversation of 200 messages (``app.store.ChatStore``); goal < 2 ms.
- ``first_chunk_late_ms``: a streamed ``/completion`` chunk's arrival after the server
  knew its first token (TTFT as the server reports it); goal <= 20 ms.
- ``free_after_disconnect_s``: a streaming client hangs up until the engine is idle;
  goal < 0.25 s.
- ``warmup_answer_ms``: llama.vim's cache warm-up (``/infill`` with ``n_predict: 0``)
  answered; goal < 500 ms.
- ``limit_change_ms``: ``PUT /v1/limits`` while a generation streams; goal < 500 ms.
- ``budget_late_ms``: how far past ``t_max_predict_ms: 60`` the answer stopped, beyond
  two tokens + 5 ms. Since issue 19 the budget follows llama.cpp: it ends the answer at the
  first line break after it, so this includes the wait for that line (no longer a
  two-token goal; the answer stops at a line's end, never mid-line).

    python -m bench.latency [--rounds 5] [--only worker,store,server]

Best (lowest) of the rounds per figure; writes bench/out/latency.json and exits 1 when a
goal is missed. The server figures use the tests' slow forged model (~7 ms a token on 2
cores) in an in-process worker on loopback, as tests/engine/server does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
GOALS: dict[str, tuple[str, float]] = {
    "worker_back_s": ("<", 3.0),
    "store_update_ms": ("<", 2.0),
    "first_chunk_late_ms": ("<=", 20.0),
    "free_after_disconnect_s": ("<", 0.25),
    "warmup_answer_ms": ("<", 500.0),
    "limit_change_ms": ("<", 500.0),
    "budget_late_ms": ("<=", 0.0),  # relative: see _budget_late
}


def worker_back(tmp: Path, rounds: int) -> list[float]:
    """Seconds from SIGKILL to the restarted worker's ready signal, once per round."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer

    from app.worker import WorkerOptions, WorkerProcess
    from tests.engine.server.live import write_model

    app = QCoreApplication.instance() or QCoreApplication([])
    model = write_model(tmp / "tiny")
    worker = WorkerProcess()

    def wait_for(signal_: Any, timeout_s: float = 60.0) -> None:
        loop = QEventLoop()
        signal_.connect(loop.quit)
        QTimer.singleShot(int(timeout_s * 1000), loop.quit)
        loop.exec()
        signal_.disconnect(loop.quit)

    ready_at: list[float] = []
    worker.ready.connect(lambda _info: ready_at.append(time.perf_counter()))
    worker.start(WorkerOptions(model=str(model), admin_token_file=str(tmp / "token")))
    wait_for(worker.ready)
    times = []
    for _ in range(rounds):
        pid = worker.pid
        assert pid is not None, "the worker did not start"
        count = len(ready_at)
        killed = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        while len(ready_at) == count and time.perf_counter() - killed < 60:
            wait_for(worker.ready, 1.0)
        times.append(ready_at[-1] - killed)
    worker.stop()
    app.processEvents()
    return times


def store_update(tmp: Path, rounds: int) -> list[float]:
    """Median ms of 200 updates of a streaming answer, once per round."""
    from app.store import ChatStore

    results = []
    for round_ in range(rounds):
        store = ChatStore(tmp / f"chats-{round_}.sqlite3")
        conv = store.create_conversation("Speed")
        for i in range(200):
            store.add_message(conv.id, "user" if i % 2 == 0 else "assistant", "x" * 400)
        answer = store.add_message(conv.id, "assistant", "", state="streaming")
        text, times = "", []
        for i in range(200):
            text += f"token{i} "
            started = time.perf_counter()
            store.update_message(answer.id, content=text)
            times.append(time.perf_counter() - started)
        store.close()
        results.append(statistics.median(times) * 1e3)
    return results


def server_figures(tmp: Path, rounds: int) -> dict[str, list[float]]:
    from tests.engine.server.live import SLOW_SPEC, serve, sse_events, write_model

    live = serve(write_model(tmp / "slow", SLOW_SPEC))
    long = {"temperature": 0, "samplers": ["temperature"], "ignore_eos": True}
    figures: dict[str, list[float]] = {k: [] for k in (
        "first_chunk_late_ms", "free_after_disconnect_s", "warmup_answer_ms",
        "limit_change_ms", "budget_late_ms")}
    try:
        with live.client() as http, live.admin() as admin:
            http.post("/completion", json={"prompt": "warm up", "n_predict": 2})
            for _ in range(rounds):
                live.wait_idle()
                start = time.perf_counter()
                first: float | None = None
                final: dict[str, Any] = {}
                with http.stream("POST", "/completion", json={
                        "prompt": "def g(y):\n" * 20, "stream": True, "n_predict": 20,
                        **long}) as response:
                    for event in sse_events(response.iter_lines()):
                        if first is None and event.get("tokens"):
                            first = time.perf_counter() - start
                        final = event
                assert first is not None
                ttft_s = final["timings"]["prompt_ms"] / 1e3
                figures["first_chunk_late_ms"].append((first - ttft_s) * 1e3)

                live.wait_idle()
                with http.stream("POST", "/completion", json={
                        "prompt": "import os\n", "stream": True, "n_predict": 800,
                        **long}) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            break
                    closed = time.perf_counter()
                live.wait_idle()
                figures["free_after_disconnect_s"].append(time.perf_counter() - closed)

                live.wait_idle()
                started = time.perf_counter()
                warm = http.post("/infill", json={"input_prefix": "def f(x):\n",
                                                  "input_suffix": "", "n_predict": 0})
                figures["warmup_answer_ms"].append((time.perf_counter() - started) * 1e3)
                assert warm.status_code == 200, warm.text

                live.wait_idle()
                with http.stream("POST", "/v1/completions", json={
                        "prompt": "x", "max_tokens": 120, "stream": True, "temperature": 0,
                        "logit_bias": {"0": -100}}) as response:
                    lines = response.iter_lines()
                    next(line for line in lines if line.startswith("data: {"))
                    started = time.perf_counter()
                    admin.put("/v1/limits", json={"host_ram": "auto"})
                    figures["limit_change_ms"].append((time.perf_counter() - started) * 1e3)
                    for _ in lines:
                        pass

                live.wait_idle()
                body = http.post("/completion", json={"prompt": "def f():\n",
                                                      "n_predict": 500,
                                                      "t_max_predict_ms": 60, **long}).json()
                figures["budget_late_ms"].append(_budget_late(body))
    finally:
        live.stop()
    return figures


def _budget_late(body: dict[str, Any]) -> float:
    """ms past the 60 ms budget beyond two tokens + 5 ms (<= 0 meets the goal)."""
    timings = body["timings"]
    return timings["predicted_ms"] - 60 - 2 * timings["predicted_per_token_ms"] - 5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="worker,store,server",
                        help="comma-separated: worker, store, server (default: all)")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    parts = set(args.only.split(","))
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        # the workers' prompt-KV store and admin token stay out of the user's folders
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
        os.environ["XDG_CONFIG_HOME"] = str(tmp / "config")
        steps: list[tuple[str, Callable[[], None]]] = [
            ("worker", lambda: samples.update(worker_back_s=worker_back(tmp, args.rounds))),
            ("store", lambda: samples.update(store_update_ms=store_update(tmp, args.rounds))),
            ("server", lambda: samples.update(server_figures(tmp, args.rounds))),
        ]
        for name, step in steps:
            if name in parts:
                step()
    report: dict[str, Any] = {}
    missed = []
    for key, values in samples.items():
        op, goal = GOALS[key]
        best = min(values)
        ok = best < goal if op == "<" else best <= goal
        report[key] = {"best": round(best, 4), "all": [round(v, 4) for v in values],
                       "goal": f"{op} {goal}", "ok": ok}
        print(f"{key:26} best {best:9.3f}   goal {op} {goal:<6}  {'ok' if ok else 'MISSED'}"
              f"   (all: {', '.join(f'{v:.3f}' for v in values)})")
        if not ok:
            missed.append(key)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "latency.json").write_text(json.dumps(report, indent=2) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
