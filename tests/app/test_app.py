"""The whole window against a worker it started itself: every view opens, and a worker
killed mid-answer is reported, restarted, and nothing written so far is lost."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QSize
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog

from app.context import AppContext
from app.store import ChatStore
from app.views.main_window import VIEWS, MainWindow
from engine import kernels
from tests.app.conftest import TINY, answers_of
from tests.engine.server.live import SLOW_SPEC, write_model

KILLS = 10


@pytest.fixture(scope="module")
def slow_4k(tmp_path_factory) -> Path:
    """``slow-coder`` with a 4,096-token context: twenty exchanges fit, however much of
    each killed answer streamed before its kill (more on a busy machine)."""
    return write_model(tmp_path_factory.mktemp("slow-4k") / "slow-coder-4k",
                       replace(SLOW_SPEC, context=4096))


@pytest.fixture
def window(qtbot, paths, models_root):
    ctx = AppContext(paths)
    ctx.settings.set_value("welcome/shown", True)
    ctx.settings.set_value("library/hf_endpoint", "http://127.0.0.1:9")  # no Hub reached
    ctx.settings.set_value("worker/threads", 1)
    ctx.settings.set_value("chat/sampling", {"temperature": 0.0, "max_tokens": 64})
    ctx.settings.set_model_roots([str(models_root)])
    ctx.store = ChatStore(paths.chats_db)
    win = MainWindow(ctx)
    qtbot.addWidget(win)
    win.show()
    yield win
    ctx.shutdown()
    ctx.store.close()


def start(qtbot, win: MainWindow, model: str) -> None:
    with qtbot.waitSignal(win.ctx.model_changed, timeout=120_000,
                          check_params_cb=lambda card: card is not None):
        win.ctx.start_local(model)
        win.attach_worker()


def test_every_view_opens_and_the_status_bar_says_where_the_model_runs(qtbot, window,
                                                                        models_root):
    start(qtbot, window, str(models_root / TINY))
    for key, *_ in VIEWS:
        view = window.show_view(key)
        assert type(view).__name__ != "QLabel", f"the {key} view failed to open"
        assert window.current_view() is view
    assert window.model_label.text() == f"Model: {TINY}"
    assert window.device_label.text() == "Runs on: CPU"
    assert window.state_label.text() == "Worker: ready"
    qtbot.waitUntil(lambda: window.gauges_dock.widget() is not None, timeout=5_000)
    assert not window.banner.isVisible()


def test_killed_worker_mid_answer_loses_nothing_ten_times(qtbot, window, slow_4k):
    ctx = window.ctx
    start(qtbot, window, str(slow_4k))
    chat = window.show_view("chat")
    worker = ctx.worker
    assert worker is not None
    # every wait is generous (a busy machine slows a restart and a long history's prefill
    # many times over): what is held is that each event comes, not how fast
    for round_ in range(KILLS):
        # a long answer streams, and the worker dies under it
        chat.settings.sampling = answers_of(400)
        leave_older_out(ctx, chat)
        assert chat.send(f"question {round_}")
        answer_streams(qtbot, ctx, chat)
        before = len(chat.message_widgets())
        pid = worker.pid
        assert pid is not None
        with qtbot.waitSignal(worker.died, timeout=120_000):
            os.kill(pid, signal.SIGKILL)
        assert ctx.model is None  # the GUI knows at once
        assert window.banner.isVisible() and "killed" in window.banner.text.text()
        # the worker comes back by itself (how fast: python -m bench.latency)
        qtbot.waitUntil(lambda: ctx.model is not None, timeout=120_000)
        assert worker.pid not in (None, pid)
        qtbot.waitUntil(lambda: not chat.answering, timeout=120_000)
        partial = last_answer(ctx, chat)
        assert len(partial.content) >= 8 and partial.state in {"failed", "stopped"}
        assert "interrupted" in partial.note
        assert len(chat.message_widgets()) == before
        # the next message works
        chat.settings.sampling = answers_of(12)
        with qtbot.waitSignal(chat.answer_finished, timeout=120_000) as done:
            assert chat.send(f"and again {round_}")
        assert done.args[0].state == "done" and done.args[0].content
    # everything, from the store on disk: 2 exchanges per round, nothing lost
    fresh = ChatStore(ctx.paths.chats_db)
    messages = fresh.messages(chat.current_conversation_id())
    assert [m.role for m in messages] == ["user", "assistant"] * (2 * KILLS)
    assert [m.content for m in messages if m.role == "user"] == [
        text for r in range(KILLS) for text in (f"question {r}", f"and again {r}")]
    assert all(m.content for m in messages)
    fresh.close()


def leave_older_out(ctx: AppContext, chat, limit: int = 1_000) -> None:
    """Once what is sent holds ``limit`` characters, leave it out of what is sent from now
    on (it stays in the conversation, as the chat's banner offers). On a busy machine more
    of each killed answer streams before the kill lands; a history near the forged
    model's 1,024 tokens gets an answer the worker caps at a few tokens, which can end
    before the kill does (seen in CI: "done" with 10 characters)."""
    conv = chat.current_conversation_id()
    sent = ctx.store.sent_messages(conv)
    if sent and sum(len(m.content) for m in sent) >= limit:
        ctx.store.set_context_from(conv, sent[-1].position + 1)


def answer_streams(qtbot, ctx: AppContext, chat, chars: int = 8) -> None:
    """Wait until the answer being written has ``chars`` characters. A history grown past
    the model's context ends the answer with the chat's banner instead: leave the oldest
    exchanges out of what is sent, as its button does, and wait again (on a busy machine
    more of each killed answer streams before the kill lands, and ten rounds outgrow the
    forged model's 1,024 tokens)."""
    def streaming_or_full() -> bool:
        if chat.banner.isVisible():
            return True
        last = ctx.store.messages(chat.current_conversation_id())[-1]
        return last.role == "assistant" and len(last.content) >= chars

    qtbot.waitUntil(streaming_or_full, timeout=120_000)
    if chat.banner.isVisible():
        assert chat.drop_oldest()
        qtbot.waitUntil(lambda: len(last_answer(ctx, chat).content) >= chars, timeout=120_000)


def last_answer(ctx: AppContext, chat):
    messages = ctx.store.messages(chat.current_conversation_id())
    assert messages and messages[-1].role == "assistant"
    return messages[-1]


def test_status_bar_shows_the_last_answers_speed(qtbot, window, models_root):
    start(qtbot, window, str(models_root / TINY))
    chat = window.show_view("chat")
    with qtbot.waitSignal(chat.answer_finished, timeout=30_000):
        chat.send("hello")
    qtbot.waitUntil(lambda: "tok/s" in window.speed_label.text(), timeout=10_000)
    assert window.speed_label.text().startswith("Last answer: ")


def test_remote_server_setting_points_the_app_at_another_server(qtbot, window, live_worker):
    url, _token = live_worker
    settings_view = window.show_view("settings")
    settings_view.remote_url.setText(url)
    with qtbot.waitSignal(window.ctx.model_changed, timeout=10_000,
                          check_params_cb=lambda card: card is not None):
        settings_view.apply_button.click()
    assert window.ctx.remote
    assert window.ctx.worker is None or window.ctx.worker.state == "stopped"
    assert window.state_label.text() == "Worker: remote server"
    assert window.model_label.text().endswith("slow-coder")
    chat = window.show_view("chat")
    with qtbot.waitSignal(chat.answer_finished, timeout=30_000) as done:
        chat.send("hello over there")
    assert done.args[0].state == "done"
    settings_view.remote_url.setText("ftp://nope")
    settings_view.apply_button.click()
    assert "http://" in settings_view.result.text()


def test_unticking_keep_threads_awake_restarts_the_worker_without_spinning(qtbot, window,
                                                                           models_root):
    import psutil

    start(qtbot, window, str(models_root / TINY))
    worker = window.ctx.worker
    assert worker is not None and worker.pid is not None
    assert "--spin-us" not in psutil.Process(worker.pid).cmdline()  # the worker's default
    settings_view = window.show_view("settings")
    assert settings_view.stay_awake.isChecked()
    settings_view.stay_awake.setChecked(False)
    with qtbot.waitSignal(window.ctx.model_changed, timeout=30_000,
                          check_params_cb=lambda card: card is not None):
        settings_view.apply_button.click()
    worker = window.ctx.worker
    assert worker is not None and worker.pid is not None
    cmdline = psutil.Process(worker.pid).cmdline()
    assert cmdline[cmdline.index("--spin-us") + 1] == "0"
    assert window.ctx.settings.threads_stay_awake is False
    assert window.state_label.text() == "Worker: ready"
    # where the worker's log is, to attach to a bug report (the restarted worker's)
    assert worker.info is not None and worker.info.log_file
    assert settings_view.worker_log.text() == worker.info.log_file


@pytest.mark.skipif(kernels.library() is None or not kernels.i8kv_ready(),
                    reason="the engine's kernels were not built")
def test_choosing_8_bit_conversation_memory_restarts_the_worker_with_int8_kv(qtbot, window,
                                                                             models_root):
    import json
    import urllib.request

    import psutil

    start(qtbot, window, str(models_root / TINY))
    settings_view = window.show_view("settings")
    assert settings_view.kv_dtype.currentData() == "auto"
    settings_view.kv_dtype.setCurrentIndex(settings_view.kv_dtype.findData("int8"))
    with qtbot.waitSignal(window.ctx.model_changed, timeout=30_000,
                          check_params_cb=lambda card: card is not None):
        settings_view.apply_button.click()
    worker = window.ctx.worker
    assert worker is not None and worker.pid is not None and worker.info is not None
    cmdline = psutil.Process(worker.pid).cmdline()
    assert cmdline[cmdline.index("--kv-dtype") + 1] == "int8"
    assert window.ctx.settings.kv_dtype == "int8"
    request = urllib.request.Request(worker.info.url + "/v1/resources", headers={
        "Authorization": f"Bearer {worker.info.admin_token}"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        kv = json.loads(reply.read())["kv"]
    assert kv["dtype"] == "int8"


def test_window_size_view_and_panel_come_back_as_left(qtbot, paths):
    ctx = AppContext(paths)
    first = MainWindow(ctx)
    qtbot.addWidget(first)
    first.show()
    chat: Any = first.show_view("chat")
    chat.splitter.setSizes([280, 420])
    first.show_view("code")
    first.toggle_gauges.setChecked(False)
    qtbot.waitUntil(lambda: not first.gauges_dock.isVisible())
    first.resize(790, 520)  # inside the offscreen screen (800 x 600)
    qtbot.waitUntil(lambda: first.size() == QSize(790, 520))
    first.close()
    again = MainWindow(AppContext(paths))
    qtbot.addWidget(again)
    again.show()
    assert again.current_view() is again.views["code"]
    assert again.size() == QSize(790, 520)
    assert not again.toggle_gauges.isChecked()
    again_chat: Any = again.show_view("chat")
    assert again_chat.splitter.sizes()[0] == 280  # the chat list's width


def test_first_run_welcome_says_where_the_model_runs_and_where_chats_live(qtbot, window,
                                                                           models_root):
    start(qtbot, window, str(models_root / TINY))
    window.show_welcome()
    dialog = window.findChild(QDialog, "welcome")
    assert dialog is not None and dialog.isVisible()
    text = dialog.text.text()
    assert "this computer's CPU" in text
    assert TINY in text and "built-in" not in text
    assert str(window.ctx.paths.chats_db) in text
    assert window.ctx.client.base_url in text
    assert window.ctx.settings.value("welcome/shown", False)


def test_a_visible_resources_panel_is_visible_again_after_quit_and_relaunch(qtbot, paths):
    """Regression: the panel was saved as hidden while visible (the window's closing hid
    it, and the save at the app's exit saw that)."""
    first = MainWindow(AppContext(paths))
    qtbot.addWidget(first)
    first.show()
    assert first.toggle_gauges.isChecked()
    qtbot.waitUntil(first.gauges_dock.isVisible)
    first.close()
    first.save_state()  # what the app does again on aboutToQuit (app/launch.py)
    again = MainWindow(AppContext(paths))
    qtbot.addWidget(again)
    again.show()
    assert again.toggle_gauges.isChecked()
    qtbot.waitUntil(again.gauges_dock.isVisible)


def test_quit_closes_the_window_at_once_and_stops_the_worker_after(qtbot, window,
                                                                   models_root):
    import psutil

    start(qtbot, window, str(models_root / TINY))
    worker = window.ctx.worker
    assert worker is not None and worker.pid is not None
    process = psutil.Process(worker.pid)
    # the resources panel holds a stream open on the worker, as it does in use
    qtbot.waitUntil(lambda: getattr(window.gauges_dock.widget(), "feed", None) is not None
                    and window.gauges_dock.widget().feed.events > 0, timeout=30_000)
    states: list[str] = []
    worker.state_changed.connect(states.append)
    quit_action = next(a for a in window.findChildren(QAction) if a.text() == "Quit")
    quit_action.trigger()
    assert not window.isVisible()  # closed before the worker was even asked to stop
    assert process.is_running() and worker.state == "ready"
    # the worker stops behind the closed window: the event loop is not held meanwhile
    qtbot.waitUntil(lambda: "stopping" in states, timeout=30_000)
    qtbot.waitUntil(lambda: worker.state == "stopped", timeout=30_000)
    assert states == ["stopping", "stopped"]
    assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    # a clean stop (exit code 0), not the kill a stop gets when it hangs
    assert worker.stopped_with == 0


def test_restarting_message_clears_once_the_worker_is_ready(qtbot, window, models_root):
    start(qtbot, window, str(models_root / TINY))
    settings_view = window.show_view("settings")
    with qtbot.waitSignal(window.ctx.model_changed, timeout=30_000,
                          check_params_cb=lambda card: card is not None):
        settings_view.restart_button.click()
        assert settings_view.result.text().startswith("Restarting the worker")
    assert "Restarting" not in settings_view.result.text()
    assert "running" in settings_view.result.text()
