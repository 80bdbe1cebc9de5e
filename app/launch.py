"""Build and run the app: window first (shown at once), then the worker and the model."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from app.paths import AppPaths, resources_dir

#: The built-in model (the same folder as engine.default_model.DEFAULT_MODEL_NAME; named
#: here too so that the window opens before the engine is imported).
DEFAULT_MODEL = "smollm2-135m-instruct"


def default_model() -> Path | None:
    """The small model shipped in resources/ (None when this install has none)."""
    folder = resources_dir() / "models" / DEFAULT_MODEL
    return folder if (folder / "genai_config.json").is_file() else None


def choose_model(requested: str | None, last: str) -> str | None:
    """The model to start with: asked for, else the last one loaded, else the default."""
    if requested:
        return requested
    if last and Path(last).is_dir():
        return last
    fallback = default_model()
    return str(fallback) if fallback else None


def timing(window: Any, ctx: Any, started: float) -> None:
    """Print when the window is on screen and when the model answers, as JSON on stderr
    (``t``: the wall clock, to compare with the launcher's)."""
    import json

    from PySide6.QtCore import QTimer

    def say(event: str) -> None:
        print(json.dumps({"event": event, "t": time.time(),
                          "since_main_s": time.perf_counter() - started}),
              file=sys.stderr, flush=True)

    QTimer.singleShot(0, lambda: say("shown"))  # after the first paint has been queued
    def on_model(card: Any) -> None:
        if card is not None:
            say("model_ready")

    ctx.model_changed.connect(on_model)


def run_gui(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from PySide6.QtCore import QTimer
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from app.context import AppContext
    from app.views.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    app.setApplicationName("ONNX Local LLM")
    app.setOrganizationName("onnx-local-llm")
    icon = resources_dir() / "icons" / "app.png"
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    ctx = AppContext(AppPaths.default())
    from app.theme import apply_theme, saved_theme

    apply_theme(saved_theme(ctx.settings), app)  # before the first paint
    window = MainWindow(ctx)
    window.show()
    if os.environ.get("ONNX_LOCAL_LLM_TIMING"):  # bench/gui.py reads these lines
        timing(window, ctx, started)

    def start_backend() -> None:
        from app.store import ChatStore

        ctx.store = ChatStore(ctx.paths.chats_db)
        window.view("chat")  # the chat view reads the store
        remote = args.remote or ctx.settings.remote_url
        if remote:
            ctx.use_remote(remote, ctx.settings.api_key or None)
            window.set_worker_state("remote")
            return
        ctx.start_local(choose_model(args.model, ctx.settings.last_model))
        window.attach_worker()
        if not ctx.settings.value("welcome/shown", False) and not args.no_welcome:
            window.show_welcome()

    QTimer.singleShot(0, start_backend)
    # the window closes at once; the app's process ends once its worker has stopped
    # (SIGTERM, killed after a few seconds: app/worker.py), so none is left behind
    app.setQuitOnLastWindowClosed(False)
    window.closed.connect(lambda: quit_when_worker_gone(app, ctx))
    app.aboutToQuit.connect(window.save_state)
    app.aboutToQuit.connect(ctx.shutdown)  # a signal's quit: the window may still be open
    quit_on_signals(app)
    return app.exec()


def quit_when_worker_gone(app: Any, ctx: Any) -> None:
    """Quit the event loop once the worker has stopped (at once when there is none)."""
    from PySide6.QtCore import QTimer

    def check(*_args: Any) -> None:
        if ctx.worker_gone():
            app.quit()

    if ctx.worker is not None:
        ctx.worker.state_changed.connect(check)
    QTimer.singleShot(0, check)  # after the window's own stop request


def quit_on_signals(app: Any) -> None:
    """SIGTERM / SIGINT (a logout, Ctrl+C in a terminal) close the app the normal way, so
    the worker is stopped too. Python runs signal handlers only when it has control: a
    timer hands it control a few times a second."""
    import signal

    from PySide6.QtCore import QTimer

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_args: app.quit())
    pulse = QTimer(app)
    pulse.setInterval(250)
    pulse.timeout.connect(lambda: None)
    pulse.start()
