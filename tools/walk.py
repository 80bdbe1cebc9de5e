"""A recorded walk through the real app on an X display (Xvfb): a screenshot and the
window's geometry at each step, and the time Ctrl+Q takes.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python tools/walk.py --out /tmp/walk

1. **Walk** (in this process: the app's own window and a real worker process, in a fresh
   app home under ``--out``): a very long chat title, two banners, the worker killed, the
   memory slider moved then the worker restarted (the limit shown before and after), a
   switch to a second model (a tiny one built here), About, the dark theme, quit. Each step
   writes ``NN-step.png`` and a line in ``walk.jsonl``: the window's geometry, where the
   chat's Stop button is on screen, and what the step noted.
2. **Quits** (``--quits N``, default 10): ``python -m app`` started N times (fresh home,
   the built-in model), Ctrl+Q pressed through the X server once the model answers
   (``xdotool``); the time until its window is unmapped, until the app's process has
   exited, and until its worker's has. ``--repo DIR`` times another checkout's app.
   Written to ``quits.json``.

Needs an X display (``DISPLAY``); ``xdotool`` for the quits (``apt-get install xdotool``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def own_home(root: Path) -> dict[str, str]:
    """Variables that keep an app (and its worker's log) inside ``root``: nothing is
    written to the user's own home, config, cache or log folders."""
    return {"ONNX_LOCAL_LLM_HOME": str(root / "app"), "HOME": str(root),
            "XDG_CONFIG_HOME": str(root / ".config"), "XDG_CACHE_HOME": str(root / ".cache"),
            "XDG_DATA_HOME": str(root / ".local/share"),
            "XDG_STATE_HOME": str(root / ".local/state")}


# --- quits -----------------------------------------------------------------------------


def _xdotool(*args: str) -> list[str]:
    done = subprocess.run(["xdotool", *args], capture_output=True, text=True, check=False)
    return done.stdout.split()


def quit_once(repo: Path, timeout_s: float = 300.0) -> dict[str, float]:
    """Start ``python -m app`` from ``repo``, press Ctrl+Q once its model answers; seconds
    from the key press until the window is gone, the app exited, its worker exited."""
    import psutil

    home = tempfile.mkdtemp(prefix="walk-quit-")
    env = {**os.environ, **own_home(Path(home)), "ONNX_LOCAL_LLM_TIMING": "1",
           "PYTHONPATH": str(repo)}
    env.pop("QT_QPA_PLATFORM", None)  # the real display
    proc = subprocess.Popen([sys.executable, "-m", "app", "--no-welcome"], cwd=repo, env=env,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        deadline, said = time.monotonic() + timeout_s, []
        for line in proc.stderr:
            said.append(line)
            if line.startswith("{") and json.loads(line).get("event") == "model_ready":
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the model did not answer in time")
        else:
            raise RuntimeError("the app ended before its model answered: "
                               + "".join(said[-10:]))
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "engine" in " ".join(p.cmdline())]
        if not workers:
            raise RuntimeError("no worker process under the app")
        windows = _xdotool("search", "--sync", "--onlyvisible", "--pid", str(proc.pid),
                           "--name", "ONNX Local LLM")
        window = windows[0]
        _xdotool("windowfocus", "--sync", window)
        time.sleep(0.5)  # let the focus settle before the key
        pressed = time.monotonic()
        _xdotool("key", "--clearmodifiers", "ctrl+q")
        gone = app_exit = worker_exit = None
        while None in (gone, app_exit, worker_exit):
            now = time.monotonic()
            if now - pressed > 60:
                raise RuntimeError("the app did not quit within 60 s")
            if gone is None and window not in _xdotool("search", "--onlyvisible", "--pid",
                                                       str(proc.pid), "--name", "ONNX"):
                gone = time.monotonic() - pressed
            if app_exit is None and proc.poll() is not None:
                app_exit = time.monotonic() - pressed
            if worker_exit is None and not any(
                    w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers):
                worker_exit = time.monotonic() - pressed
            time.sleep(0.005)
        assert gone is not None and app_exit is not None and worker_exit is not None
        return {"window_gone_s": round(gone, 3), "app_exit_s": round(app_exit, 3),
                "worker_exit_s": round(worker_exit, 3)}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        shutil.rmtree(home, ignore_errors=True)


def time_quits(runs: int, repo: Path, out: Path) -> dict[str, Any]:
    if shutil.which("xdotool") is None:
        raise SystemExit("--quits needs xdotool (apt-get install xdotool)")
    rows = []
    for n in range(runs):
        row = quit_once(repo)
        rows.append(row)
        print(f"quit {n + 1}/{runs}: {json.dumps(row)}", flush=True)
    summary = {key: {"min": min(r[key] for r in rows), "median": statistics.median(
        r[key] for r in rows), "max": max(r[key] for r in rows)} for key in rows[0]}
    report = {"repo": str(repo), "runs": rows, "summary": summary}
    (out / "quits.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps(summary), flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "walk",
                        help="folder for the screenshots and logs")
    parser.add_argument("--quits", type=int, default=10, help="Ctrl+Q quits to time (0: none)")
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="the checkout whose app the quits time (default: this one)")
    parser.add_argument("--no-walk", action="store_true", help="only time the quits")
    parser.add_argument("--second-model", type=Path, default=SECOND_MODEL,
                        help="a model folder to switch to (copied into the walk's library)")
    args = parser.parse_args(argv)
    if not os.environ.get("DISPLAY"):
        parser.error("no X display: run under xvfb-run (see the module's docstring)")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_walk:
        walk(args.out.resolve(), args.second_model)
    if args.quits:
        time_quits(args.quits, args.repo.resolve(), args.out)
    return 0


# --- the walk --------------------------------------------------------------------------

SECOND_MODEL = Path("/work/shared/reference-models/tiny-genai-fp32")
LONG_TITLE = ("A very long chat title that keeps going: how do I read a large CSV file in "
              "Python without running out of memory, and then group it by two columns?")


class Walk:
    """The app in this process, stepped through; one screenshot and log line a step."""

    def __init__(self, out: Path, second_model: Path | None) -> None:
        os.environ.update(own_home(out / "home"))  # before anything reads the home
        os.environ.pop("QT_QPA_PLATFORM", None)
        from PySide6.QtWidgets import QApplication

        from app.context import AppContext
        from app.launch import default_model
        from app.paths import AppPaths
        from app.store import ChatStore
        from app.theme import apply_theme
        from app.views.main_window import MainWindow

        self.out = out
        app = QApplication.instance() or QApplication(["walk"])
        assert isinstance(app, QApplication)
        self.app = app
        self.app.setApplicationName("ONNX Local LLM")
        self.ctx = ctx = AppContext(AppPaths.default())
        ctx.settings.set_value("welcome/shown", True)
        library = out / "library"
        self.second: Path | None = None
        if second_model is not None and second_model.is_dir():
            self.second = library / second_model.name
            if not self.second.exists():
                shutil.copytree(second_model, self.second)
            ctx.settings.set_model_roots([str(library)])
        apply_theme("light", self.app)
        ctx.store = ChatStore(ctx.paths.chats_db)
        self.window = MainWindow(ctx)
        self.window.resize(1200, 780)
        self.window.move(40, 40)
        self.window.show()
        builtin = default_model()
        self.builtin = builtin
        ctx.start_local(str(builtin) if builtin else None)
        self.window.attach_worker()
        self.log = (out / "walk.jsonl").open("w", encoding="utf-8")
        self.n = 0

    # --- plumbing -----------------------------------------------------------------------

    def wait(self, done: Any, timeout_s: float = 120.0, what: str = "") -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                print(f"  (gave up waiting for {what or 'it'} after {timeout_s:.0f} s)")
                return False
            self.app.processEvents()
            time.sleep(0.01)
        return True

    def settle(self, seconds: float = 0.4) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.app.processEvents()
            time.sleep(0.01)

    @property
    def chat(self) -> Any:
        return self.window.views["chat"]

    @property
    def gauges(self) -> Any:
        return self.window.gauges_dock.widget()

    def facts(self) -> dict[str, Any]:
        from PySide6.QtCore import QPoint

        win, chat = self.window, self.chat
        geo, frame = win.geometry(), win.frameGeometry()
        stop = chat.stop_button.mapToGlobal(QPoint(0, 0))
        slider = getattr(self.gauges, "ram_limit", None)
        return {
            "window": [geo.x(), geo.y(), geo.width(), geo.height()],
            "frame": [frame.x(), frame.y(), frame.width(), frame.height()],
            "stop": [stop.x(), stop.y()],
            "title_y": chat.title.mapTo(win, QPoint(0, 0)).y(),
            "picker": [chat.model_picker.width(), chat.model_picker.currentText()],
            "banner": win.banner.isVisible(),
            "worker": win.state_label.text(),
            "model": (self.ctx.model or {}).get("id"),
            "limit_shown": slider.label.text() if slider is not None else None,
            "limit_setting": self.ctx.settings.host_ram_limit,
        }

    def step(self, name: str, **noted: Any) -> dict[str, Any]:
        from PySide6.QtGui import QGuiApplication

        self.settle()
        self.n += 1
        shot = self.out / f"{self.n:02d}-{name}.png"
        screen = QGuiApplication.primaryScreen()
        screen.grabWindow(0).save(str(shot))
        row = {"step": self.n, "name": name, **self.facts(), **noted}
        self.log.write(json.dumps(row) + "\n")
        self.log.flush()
        print(f"{self.n:02d} {name}: window {row['window']} stop {row['stop']} "
              f"picker {row['picker'][0]} px '{row['picker'][1]}' {noted or ''}", flush=True)
        return row

    # --- the steps ------------------------------------------------------------------------

    def run(self) -> None:
        ctx, win = self.ctx, self.window
        self.wait(lambda: ctx.model is not None, what="the model")
        self.wait(lambda: self.gauges is not None and self.gauges.feed.events > 0,
                  what="the resources feed")
        self.step("start")
        chat: Any = win.show_view("chat")
        conv = chat.new_conversation()
        chat.conversations.rename(conv, LONG_TITLE)
        chat.open_conversation(conv)
        self.step("long-title", title_elided=chat.title.elided())
        chat.settings.max_tokens.setValue(48)
        self.wait(lambda: chat.send("Say hello in three words."), 5)
        self.wait(lambda: chat.answering, 10, "the answer to start")
        self.step("answering", stop_enabled=chat.stop_button.isEnabled())
        self.wait(lambda: not chat.answering, 120, "the answer")
        win.banner.show_message("warning", "First banner: the model is larger than the "
                                "memory limit allows; answers may be slow.",
                                "details of the first banner")
        self.step("banner-1")
        chat.banner.show_overflow(3000, 2048, True)
        self.step("banner-2")
        win.banner.hide()
        chat.banner.hide()
        worker = ctx.worker
        assert worker is not None and worker.pid is not None
        killed = worker.pid
        os.kill(killed, 9)
        self.wait(lambda: worker.state == "restarting", 30, "the restart")
        self.step("worker-killed", killed_pid=killed)
        self.wait(lambda: ctx.model is not None, what="the model after the kill")
        self.step("worker-back", pid=worker.pid)
        self.slider_then_restart()
        self.switch_model()
        about: Any = win.show_about()
        self.settle(0.8)
        bar = about.text.horizontalScrollBar()
        self.step("about", sideways_scroll=bar.maximum())
        about.close()
        settings: Any = win.show_view("settings")
        settings.theme.setCurrentIndex(settings.theme.findData("dark"))
        self.step("dark-settings")
        win.show_view("chat")
        self.step("dark-chat")
        self.quit()

    def slider_then_restart(self) -> None:
        ctx, win = self.ctx, self.window
        slider = self.gauges.ram_limit
        self.wait(lambda: slider.slider.isEnabled(), 60, "the memory slider")
        low, high = slider.slider.minimum(), slider.slider.maximum()
        target = low + (high - low) // 3
        before = self.step("slider-before", slider_mib=slider.slider.value())
        slider.slider.setValue(target)
        slider.send()
        self.wait(lambda: slider._reply is None, 30, "the limit to apply")
        moved = self.step("slider-moved", slider_mib=target, outcome=slider.outcome.text())
        settings: Any = win.show_view("settings")
        worker = ctx.worker
        assert worker is not None
        old_pid = worker.pid
        settings.restart_button.click()
        self.wait(lambda: worker.state == "ready" and worker.pid not in (None, old_pid),
                  what="the worker after the restart")
        self.wait(lambda: ctx.model is not None, what="the model after the restart")
        events = self.gauges.feed.events
        self.wait(lambda: self.gauges.feed.events > events + 1, 30,
                  "the restarted worker's figures")
        win.show_view("chat")
        after = self.step("after-restart", slider_mib=slider.slider.value())
        print(f"   limit shown: before {before['limit_shown']!r}; moved {moved['limit_shown']!r};"
              f" after the restart {after['limit_shown']!r}", flush=True)

    def switch_model(self) -> None:
        ctx, picker = self.ctx, self.chat.model_picker
        if self.second is None:
            self.step("model-switch", skipped="no second model")
            return
        self.wait(lambda: any(key == str(self.second) for _t, key, _l in picker.entries()),
                  30, "the second model in the picker")
        index = picker.findData(str(self.second))
        if index < 0:
            self.step("model-switch", skipped="the second model is not in the picker")
            return
        first = (ctx.model or {}).get("id")
        picker.setCurrentIndex(index)
        picker.activated.emit(index)
        self.step("model-loading")
        self.wait(lambda: (ctx.model or {}).get("id") not in (None, first), 120,
                  "the second model")
        self.step("model-switched", from_model=first)

    def quit(self) -> None:
        from PySide6.QtGui import QAction

        worker = self.ctx.worker
        action = next(a for a in self.window.findChildren(QAction) if a.text() == "Quit")
        pressed = time.monotonic()
        action.trigger()
        self.wait(lambda: not self.window.isVisible(), 30)
        gone = time.monotonic() - pressed
        self.wait(lambda: worker is None or worker.state == "stopped", 30)
        stopped = time.monotonic() - pressed
        row = {"step": self.n + 1, "name": "quit", "window_gone_s": round(gone, 3),
               "worker_stopped_s": round(stopped, 3),
               "worker_exit_code": getattr(worker, "stopped_with", None)}
        self.log.write(json.dumps(row) + "\n")
        self.log.close()
        print(f"{row['step']:02d} quit: window gone {gone:.3f} s, worker stopped "
              f"{stopped:.3f} s (exit code {row['worker_exit_code']})", flush=True)
        if self.ctx.store is not None:
            self.ctx.store.close()


def walk(out: Path, second_model: Path | None = SECOND_MODEL) -> None:
    Walk(out, second_model).run()


if __name__ == "__main__":
    sys.exit(main())
