"""Render every view of the app into PNGs (docs/screenshots/), under Xvfb.

    xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python tools/screenshots.py

Starts a real worker on the built-in model (or ``--model DIR``), opens the main window,
sends one chat message, asks the code pane for one completion, then grabs the window on
each view. Uses a throwaway app home, so your own chats and settings are untouched.

``--reasoning`` instead forges the test suite's scripted reasoning model (a Qwen3-like
template; tests/engine/server/test_reasoning.py), asks it one question and writes
``reasoning-folded.png`` and ``reasoning-open.png``: its thoughts folded, then opened.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def wait_until(app: Any, done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app.processEvents()
        if done():
            return True
        time.sleep(0.01)
    return False


def has_suggestion(view: Any) -> bool:
    return bool(view.suggestion)


def settle(app: Any, seconds: float) -> None:
    wait_until(app, lambda: False, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the built-in model)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--reasoning", action="store_true",
                        help="the reasoning model's folded thoughts only")
    args = parser.parse_args()
    os.environ["ONNX_LOCAL_LLM_HOME"] = tempfile.mkdtemp(prefix="app-shots-")
    if args.reasoning:
        from tests.engine.server.test_reasoning import MODEL, forge_thinker

        args.model = str(forge_thinker(Path(tempfile.mkdtemp(prefix="thinker-")) / MODEL))
    from PySide6.QtWidgets import QApplication

    from app.context import AppContext
    from app.launch import choose_model
    from app.paths import AppPaths
    from app.store import ChatStore
    from app.views.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    ctx = AppContext(AppPaths.default())
    ctx.settings.set_value("welcome/shown", True)
    ctx.store = ChatStore(ctx.paths.chats_db)
    window = MainWindow(ctx)
    window.resize(1360, 860)
    window.show()
    ctx.start_local(choose_model(args.model, ""))
    window.attach_worker()
    if not wait_until(app, lambda: ctx.model is not None, 60):
        print("the worker did not come up", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    chat: Any = window.show_view("chat")
    if args.reasoning:
        return reasoning_shots(app, window, chat, args.out)
    chat.send("Write a Python function that reverses a string.")
    wait_until(app, lambda: not chat.answering, 60)
    settle(app, 2.5)  # let the gauges gather a few points
    shots = {"chat": None, "code": "code", "models": "models", "editors": "editors",
             "settings": "settings"}
    for name, key in shots.items():
        view: Any = window.show_view(key or name)
        if name == "code":
            before = "def mean(values):\n    total = 0\n    for i in range("
            after = ":\n        total += values[i]\n    return total / len(values)\n"
            view.editor.setPlainText(before + after)
            cursor = view.editor.textCursor()
            cursor.setPosition(len(before))
            view.editor.setTextCursor(cursor)
            view.request_now()
            wait_until(app, functools.partial(has_suggestion, view), 30)
        settle(app, 1.0)
        window.grab().save(str(args.out / f"{name}.png"))
        print(f"wrote {args.out / f'{name}.png'}")
    window.show_welcome()
    settle(app, 0.5)
    for widget in app.topLevelWidgets():
        if widget.objectName() == "welcome" and widget.isVisible():
            widget.grab().save(str(args.out / "welcome.png"))
            print(f"wrote {args.out / 'welcome.png'}")
    ctx.shutdown()
    return 0


def reasoning_shots(app: Any, window: Any, chat: Any, out: Path) -> int:
    from tests.engine.server.test_reasoning import ASK

    chat.settings.system_prompt.setPlainText("")  # the script's prompt has no system turn
    chat.send(ASK[0]["content"])
    wait_until(app, lambda: not chat.answering, 60)
    settle(app, 1.0)
    window.grab().save(str(out / "reasoning-folded.png"))
    chat.message_widgets()[-1].thoughts_button.click()
    settle(app, 0.5)
    window.grab().save(str(out / "reasoning-open.png"))
    print(f"wrote {out / 'reasoning-folded.png'} and reasoning-open.png")
    window.ctx.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
