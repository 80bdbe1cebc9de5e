"""``--selftest --remote URL``: the self-test's chat message and code completion sent to a
remote server through the app's own remote path (the probe, the SSE reader, the Code
pane's choice of FIM path: app/remote.py), as a JSON report. Exit 0 when both answered
with text.

Qt's network stack on a QCoreApplication: no window, no display needed.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, QTimer, SignalInstance

from app.client import ApiFailure, WorkerClient
from app.remote import RemoteCaps, RemoteProbe, fim_answer, fim_request, refused

CHAT = "Write one sentence about the sea."
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(2, 3))\n"


def _wait(done: SignalInstance, failed: SignalInstance | None, timeout_s: float
          ) -> tuple[str, Any]:
    """Run Qt's loop until ``done`` or ``failed`` fires, or ``timeout_s`` passes."""
    loop = QEventLoop()
    result: list[tuple[str, Any]] = []

    def finish(kind: str, value: Any = None) -> None:
        if not result:
            result.append((kind, value))
            loop.quit()

    done.connect(lambda value=None: finish("done", value))
    if failed is not None:
        failed.connect(lambda failure: finish("failed", failure))
    QTimer.singleShot(int(timeout_s * 1000), lambda: finish("timeout"))
    loop.exec()
    return result[0]


def _words(kind: str, value: Any) -> str:
    if kind == "timeout":
        return "no answer in time"
    return value.text() if isinstance(value, ApiFailure) else str(value)


def check_remote(url: str, api_key: str | None = None, timeout_s: float = 120.0
                 ) -> dict[str, Any]:
    """Probe ``url``, send one chat message and one code completion; the report."""
    app = QCoreApplication.instance() or QCoreApplication([])
    holder = QObject(app)
    client = WorkerClient(holder)
    client.configure(url, api_key)
    report: dict[str, Any] = {"remote": url, "ok": False}
    probe = RemoteProbe(client, holder)
    kind, caps = _wait(probe.done, None, timeout_s)
    if kind != "done" or not isinstance(caps, RemoteCaps):
        report["error"] = "the server did not answer the probe"
        return report
    report.update(server=caps.server, models=caps.models, fim_paths=list(caps.paths),
                  resources_reported=caps.has_resources)
    model = caps.models[0] if caps.models else ""

    start = time.perf_counter()
    stream = client.chat([{"role": "user", "content": CHAT}],
                         {"max_tokens": 48, "temperature": 0.0}, model=model)
    kind, value = _wait(stream.finished, stream.failed, timeout_s)
    chat_text = stream.text
    report["chat"] = {"ok": kind == "done" and bool(chat_text.strip()), "text": chat_text,
                      "ms": round((time.perf_counter() - start) * 1000)}
    if kind != "done":
        report["chat"]["error"] = _words(kind, value)

    start = time.perf_counter()
    completion: dict[str, Any] = {"ok": False}
    while True:
        path, body = fim_request(caps, PREFIX, "", SUFFIX, 32, mid_line=False)
        reply = client.call("POST", path, body, timeout_ms=int(timeout_s * 1000))
        kind, value = _wait(reply.finished, reply.failed, timeout_s)
        if kind == "failed" and refused(value) and caps.drop_path():
            continue
        break
    used = caps.path
    if kind == "done":
        text = str(fim_answer(caps, value, SUFFIX).get("content") or "")
        completion = {"ok": bool(text.strip()), "text": text}
    else:
        completion["error"] = _words(kind, value)
    completion.update(path=used, ms=round((time.perf_counter() - start) * 1000))
    report["completion"] = completion
    report["ok"] = bool(report["chat"]["ok"] and completion["ok"])
    holder.deleteLater()
    return report


def run_remote_selftest(url: str, api_key: str | None = None, timeout_s: float = 120.0) -> int:
    report = check_remote(url, api_key, timeout_s)
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_remote_selftest(sys.argv[1]))
