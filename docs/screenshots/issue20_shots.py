"""Screenshots of issue 20's parts (docs/screenshots/*.png), under Xvfb:

    Xvfb :99 & DISPLAY=:99 .venv/bin/python docs/screenshots/issue20_shots.py

A real worker on a forged model with a 1,024-token context (tests/forge: its text is
random, its sizes real), a throwaway app home: the context banner and the messages left
out, the RAM slider at its lower end, an answer refused for memory, the code pane with a
file open; then the remote-engine status against llama-cpp-python's server on the
SmolLM2 GGUF when .venv-peers has it (tests/app/remote_servers.py), else the Starlette
stand-in.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "screenshots"
sys.path.insert(0, str(ROOT))


def wait_until(app: Any, done: Callable[[], bool], timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app.processEvents()
        if done():
            return True
        time.sleep(0.01)
    return False


def save(app: Any, widget: Any, name: str) -> None:
    wait_until(app, lambda: False, 0.6)
    widget.grab().save(str(OUT / f"{name}.png"))
    print(f"wrote {OUT / f'{name}.png'}")


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="issue20-shots-"))
    os.environ["ONNX_LOCAL_LLM_HOME"] = str(home / "app")
    from PySide6.QtWidgets import QApplication

    from app.context import AppContext
    from app.paths import AppPaths
    from app.store import ChatStore
    from app.views.main_window import MainWindow
    from tests.app import remote_servers
    from tests.engine.server.live import SLOW_SPEC, write_model

    models = home / "models"
    write_model(models / "forged-coder", SLOW_SPEC)
    app = QApplication(sys.argv[:1])
    ctx = AppContext(AppPaths.default())
    ctx.settings.set_value("welcome/shown", True)
    ctx.settings.set_value("worker/threads", 1)
    ctx.settings.set_model_roots([str(models)])
    ctx.store = ChatStore(ctx.paths.chats_db)
    window = MainWindow(ctx)
    window.resize(1360, 860)
    window.show()
    ctx.start_local(str(models / "forged-coder"))
    window.attach_worker()
    if not wait_until(app, lambda: ctx.model is not None):
        print("the worker did not come up", file=sys.stderr)
        return 1
    chat: Any = window.show_view("chat")
    chat.settings.max_tokens.setValue(24)
    chat.settings.temperature.setValue(0.0)
    chat.send(" ".join(f"p{i}" for i in range(150)))
    wait_until(app, lambda: not chat.answering)
    chat.send(" ".join(f"q{i}" for i in range(200)))  # together more than the context
    wait_until(app, lambda: chat.banner.isVisible())
    save(app, window, "context-banner")
    chat.drop_oldest()
    wait_until(app, lambda: not chat.answering)
    save(app, window, "context-left-out")

    panel: Any = window.gauges_dock.widget()
    ram = panel.ram_limit
    wait_until(app, lambda: ram.slider.isEnabled())
    ram.slider.setValue(ram.slider.minimum())
    wait_until(app, lambda: ram.outcome.text().startswith("RAM limit set"))
    save(app, window.gauges_dock, "memory-slider-lowest")

    reply = ctx.client.call("PUT", "/v1/limits", {"host_ram": str(64 << 20)}, admin=True)
    wait_until(app, lambda: reply.done)
    wait_until(app, lambda: "64.0 MiB limit" in panel.ram.figures.text(), 20)
    chat.new_conversation()
    chat.send("hello")
    wait_until(app, lambda: not chat.answering)
    save(app, window, "refused-answer")
    ram.slider.setValue(ram.slider.maximum())
    wait_until(app, lambda: ram.outcome.text().startswith("RAM limit set to"))

    source = home / "shapes.py"
    source.write_text('import math\n\n\ndef circle_area(radius: float) -> float:\n'
                      '    """The area of a circle."""\n    return math.pi * radius ** 2\n',
                      encoding="utf-8")
    code: Any = window.show_view("code")
    code.debounce_ms = 600_000
    code.files.open(source)
    save(app, window, "code-file")

    gguf = remote_servers.smollm2_gguf()
    port = remote_servers.free_port()
    if gguf is not None and remote_servers.peers_has("llama_cpp.server"):
        args = [str(remote_servers.PEERS_PYTHON), "-m", "llama_cpp.server", "--model",
                str(gguf), "--host", "127.0.0.1", "--port", str(port), "--n_threads", "1"]
    else:
        args = [remote_servers.standin_python(),
                str(ROOT / "tests" / "app" / "thirdparty_standin.py"), str(port)]
    with remote_servers.serving(args, port) as url:
        settings: Any = window.show_view("settings")
        settings.remote_url.setText(url)
        settings.apply_button.click()
        wait_until(app, lambda: ctx.remote_caps is not None)
        save(app, window, "remote-status")
        chat = window.show_view("chat")
        chat.new_conversation()
        chat.send("Say hello in one sentence.")
        wait_until(app, lambda: not chat.answering, 300)
        save(app, window, "remote-chat")
    window.close()
    wait_until(app, lambda: ctx.worker is None or ctx.worker.state == "stopped", 30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
