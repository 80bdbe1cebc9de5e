"""``--selftest``: start the worker, load the model, answer one chat message and one code
completion, print a JSON report, exit 0 when all of it worked (1 otherwise).

Headless (no Qt) and offline: the worker listens on 127.0.0.1 only, Hugging Face access is
switched off in its environment, and the requests go to loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from app.launch import choose_model, default_model
from app.paths import AppPaths
from app.worker import WorkerOptions, command_for


def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[dict[str, Any], float]:
    data = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        answer = json.loads(reply.read().decode("utf-8"))
    return answer, (time.perf_counter() - start) * 1000


def _start(model: str, home: AppPaths, timeout: float) -> tuple[subprocess.Popen[bytes],
                                                                dict[str, Any], float]:
    options = WorkerOptions(model=model, admin_token_file=str(home.admin_token_file),
                            kv_store_dir=str(home.cache_dir / "selftest-kv"))
    program, args = command_for(options)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen([program, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    ready_s = time.perf_counter() - start
    if not line:
        err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
        proc.wait(timeout)
        raise RuntimeError(f"the worker exited with code {proc.returncode}: "
                           f"{err.strip()[-1500:]}")
    return proc, json.loads(line), ready_s


def _kernels(url: str, timeout: float) -> dict[str, Any] | None:
    """Whether the worker's model runs the engine's own attention kernel, and why not
    (``/props``), for the report a bug report carries."""
    with urllib.request.urlopen(url + "/props", timeout=timeout) as reply:
        kernels: dict[str, Any] | None = json.loads(reply.read().decode("utf-8")).get(
            "engine_kernels")
    return kernels


def _checks(url: str, timeout: float) -> dict[str, Any]:
    chat, chat_ms = _post(url + "/v1/chat/completions", {
        "model": "", "messages": [{"role": "user", "content": "Write a Python function that "
                                   "adds two numbers."}],
        "max_tokens": 48, "temperature": 0}, timeout)
    text = chat["choices"][0]["message"]["content"]
    fim, fim_ms = _post(url + "/infill", {"input_prefix": "def add(a, b):\n    return ",
                                          "input_suffix": "\n", "n_predict": 16}, timeout)
    completion = fim.get("content", "")
    return {
        "chat": {"ok": bool(text.strip()), "text": text, "ms": round(chat_ms, 1),
                 "completion_tokens": chat.get("usage", {}).get("completion_tokens")},
        "fim": {"ok": bool(completion.strip()), "text": completion, "ms": round(fim_ms, 1)},
    }


def run_selftest(model: str | None, timeout: float) -> int:
    report: dict[str, Any] = {"ok": False, "python": sys.version.split()[0],
                              "frozen": bool(getattr(sys, "frozen", False))}
    paths = AppPaths.default().ensure()
    chosen = choose_model(model, "")
    report["model_dir"] = chosen
    report["default_model"] = str(default_model()) if default_model() else None
    if chosen is None:
        report["error"] = "no model: this install has no built-in model and none was given"
        print(json.dumps(report, indent=2))
        return 1
    proc = None
    try:
        proc, ready, ready_s = _start(chosen, paths, timeout)
        report.update({"ready_s": round(ready_s, 2), "url": ready["url"],
                       "model": ready.get("model"), "listens_on": ready.get("host")})
        report["engine_kernels"] = _kernels(ready["url"], timeout)
        report.update(_checks(ready["url"], timeout))
        report["ok"] = bool(report["chat"]["ok"] and report["fim"]["ok"]
                            and ready.get("host") == "127.0.0.1")
    except (RuntimeError, OSError, urllib.error.URLError, ValueError, KeyError) as exc:
        report["error"] = f"{exc.__class__.__name__}: {exc}"
    finally:
        if proc is not None:
            proc.terminate()
            try:
                report["worker_exit_code"] = proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                report["worker_exit_code"] = "killed"
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1
