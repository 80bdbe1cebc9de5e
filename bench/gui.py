"""The desktop app's responsiveness: time to window, and main-thread stalls while an
answer streams.

    .venv/bin/python -m bench.gui [--model DIR] [--runs 5] [--tokens 200]

1. **Start-up**: ``python -m app`` launched ``--runs`` times (fresh app home each time);
   from the launch to the window being shown (goal ≤ 1.5 s) and to the model answering.
2. **Stalls**: the main window in this process, its worker a real subprocess; a QTimer
   probe ticks every 5 ms on the GUI thread while the chat view streams a ``--tokens``
   answer; a stall is how late a tick fires. Reports max and p99 (goal: max ≤ 50 ms).

Offscreen Qt unless DISPLAY is set. Results: bench/out/gui.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TICK_MS = 5


def startup_once(model: str | None) -> dict[str, float]:
    home = tempfile.mkdtemp(prefix="bench-gui-")
    env = {**os.environ, "ONNX_LOCAL_LLM_HOME": home, "ONNX_LOCAL_LLM_TIMING": "1",
           "PYTHONPATH": str(REPO)}
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    args = [sys.executable, "-m", "app", "--no-welcome"] + (["--model", model] if model else [])
    launched = time.time()
    proc = subprocess.Popen(args, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: dict[str, float] = {}
    try:
        for line in proc.stderr:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            seen[event["event"]] = event["t"] - launched
            if "model_ready" in seen:
                break
    finally:
        proc.terminate()
        proc.wait(20)
    return {"shown_s": seen["shown"], "model_ready_s": seen["model_ready"]}


def stall_probe(model: str, tokens: int) -> dict[str, Any]:
    os.environ["ONNX_LOCAL_LLM_HOME"] = tempfile.mkdtemp(prefix="bench-gui-")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    sys.path.insert(0, str(REPO))
    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication

    from app.context import AppContext
    from app.paths import AppPaths
    from app.store import ChatStore
    from app.views.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    ctx = AppContext(AppPaths.default())
    ctx.settings.set_value("welcome/shown", True)
    ctx.settings.set_value("chat/sampling", {"temperature": 0.0, "max_tokens": tokens})
    ctx.store = ChatStore(ctx.paths.chats_db)
    window = MainWindow(ctx)
    window.show()
    ctx.start_local(model)
    window.attach_worker()
    deadline = time.monotonic() + 120
    while ctx.model is None and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.005)
    chat: Any = window.show_view("chat")
    # exactly `tokens` tokens: the special tokens (ids 0-8 in our models: end of text,
    # end of turn, FIM markers) are barred
    barred = {str(i): -100 for i in range(9)}
    chat.settings.sampling = lambda: {"temperature": 0.0, "max_tokens": tokens,
                                      "logit_bias": barred}
    clock = QElapsedTimer()
    late: list[float] = []
    last = [0.0]

    def tick() -> None:
        now = clock.nsecsElapsed() / 1e6
        if last[0]:
            late.append(max(0.0, now - last[0] - TICK_MS))
        last[0] = now

    probe = QTimer()
    probe.setInterval(TICK_MS)
    probe.timeout.connect(tick)
    answers: list[Any] = []
    chat.answer_finished.connect(answers.append)
    for _ in range(60):  # settle: gauges' first snapshots, view layout
        app.processEvents()
        time.sleep(0.005)
    clock.start()
    probe.start()
    started = time.perf_counter()
    chat.send("Write a Python class for a bank account with deposit and withdraw.")
    while not answers and time.perf_counter() - started < 120:
        app.processEvents()
        time.sleep(0.0005)
    elapsed = time.perf_counter() - started
    probe.stop()
    message = answers[0] if answers else None
    ctx.shutdown()
    stalls = np.array(late)
    return {"ticks": len(late), "answer_s": round(elapsed, 3),
            "completion_tokens": getattr(message, "tokens", None),
            "answer_chars": len(getattr(message, "content", "") or ""),
            "stall_max_ms": round(float(stalls.max()), 2),
            "stall_p99_ms": round(float(np.percentile(stalls, 99)), 2),
            "stall_p50_ms": round(float(np.percentile(stalls, 50)), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the built-in model)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from app.launch import choose_model

    model = choose_model(args.model, "")
    if model is None:
        parser.error("no built-in model in this tree: pass --model DIR")
    starts = [startup_once(model) for _ in range(args.runs)]
    shown = sorted(s["shown_s"] for s in starts)
    ready = sorted(s["model_ready_s"] for s in starts)
    stalls = stall_probe(model, args.tokens)
    result = {"model": model, "runs": args.runs,
              "shown_s": {"median": shown[len(shown) // 2], "max": shown[-1]},
              "model_ready_s": {"median": ready[len(ready) // 2], "max": ready[-1]},
              "stalls": stalls, "load_avg": os.getloadavg()}
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "gui.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
