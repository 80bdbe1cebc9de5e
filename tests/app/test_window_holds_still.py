"""The window holds still: nothing but the user resizes it, and the page under the
pointer does not move. Long titles and status texts elide (whole in a tooltip), banners
lie over the page, the model picker keeps its width through a worker restart."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from PySide6.QtCore import QPoint

from app.context import AppContext
from app.store import ChatStore
from app.views.main_window import MainWindow
from tests.app.conftest import TINY

LONG = "A very long question about " + " ".join(["the window and its many parts"] * 12)


@pytest.fixture
def window(qtbot, paths, models_root):
    ctx = AppContext(paths)
    ctx.settings.set_value("welcome/shown", True)
    ctx.settings.set_value("worker/threads", 1)
    ctx.settings.set_value("chat/sampling", {"temperature": 0.0, "max_tokens": 8})
    ctx.settings.set_model_roots([str(models_root)])
    ctx.store = ChatStore(paths.chats_db)
    win = MainWindow(ctx)
    qtbot.addWidget(win)
    win.resize(760, 560)  # inside the offscreen screen (800 x 600)
    win.show()
    with qtbot.waitSignal(ctx.model_changed, timeout=120_000,
                          check_params_cb=lambda card: card is not None):
        ctx.start_local(str(models_root / TINY))
        win.attach_worker()
    qtbot.waitUntil(lambda: win.gauges_dock.widget() is not None, timeout=10_000)
    yield win
    ctx.shutdown()
    ctx.store.close()


def geometry(qtbot, win: MainWindow) -> tuple[int, int, QPoint]:
    """The window's size and where the chat's Stop button is in it, once laid out."""
    qtbot.wait(50)  # the layout's pending requests
    chat: Any = win.views["chat"]
    return win.width(), win.height(), chat.stop_button.mapTo(win, QPoint(0, 0))


def test_a_very_long_chat_title_elides_and_the_window_keeps_its_size(qtbot, window):
    chat: Any = window.show_view("chat")
    before = geometry(qtbot, window)
    assert before[:2] == (760, 560)  # as asked: no view's width holds the window wider
    conv = chat.new_conversation()
    chat.conversations.rename(conv, LONG)
    chat.open_conversation(conv)
    assert geometry(qtbot, window) == before
    assert chat.title.toolTip() == LONG  # the whole title, on hover
    assert chat.title.text() == LONG
    # a long model name and speed line in the status bar do not widen it either
    window.model_label.setText("Model: " + "a-very-long-model-name-" * 8)
    window.show_speed(123456.7, 98765.0)
    assert geometry(qtbot, window) == before
    assert window.model_label.toolTip().startswith("Model: a-very-long")


def test_banners_lie_over_the_page_and_move_nothing(qtbot, window):
    chat: Any = window.show_view("chat")
    before = geometry(qtbot, window)
    top = chat.title.mapTo(window, QPoint(0, 0))
    window.banner.show_message("warning", "First: " + LONG, "details\n" * 8)
    window.banner.show_message("error", "Second: " + LONG)
    chat.notice.say("The chat's own notice: " + LONG)
    qtbot.waitUntil(window.banner.isVisible)
    assert geometry(qtbot, window) == before
    assert chat.title.mapTo(window, QPoint(0, 0)) == top  # the page is not pushed down
    window.banner.details_button.setChecked(True)
    assert geometry(qtbot, window) == before
    # over the page only: the rail of views stays in reach
    assert window.banner.geometry().left() == window.stack.geometry().left()
    assert window.banner.width() == window.stack.width()
    window.banner.close_button.click()
    assert geometry(qtbot, window) == before
    # news goes by itself (it covers the top of the page); warnings wait to be dismissed
    window.banner.show_message("info", "The worker is running again.")
    qtbot.waitUntil(lambda: not window.banner.isVisible(), timeout=60_000)
    assert geometry(qtbot, window) == before


def test_the_model_picker_keeps_its_width_through_a_worker_restart(qtbot, window):
    chat: Any = window.show_view("chat")
    qtbot.waitUntil(lambda: chat.model_picker.entries() != [], timeout=30_000)
    before, picker_width = geometry(qtbot, window), chat.model_picker.width()
    worker = window.ctx.worker
    assert worker is not None and worker.pid is not None
    with qtbot.waitSignal(worker.died, timeout=60_000):
        os.kill(worker.pid, signal.SIGKILL)
    # while the worker comes back: the picker waits, at the same width, in the same window
    assert chat.model_picker.currentText() == "waiting for the worker…"
    assert chat.model_picker.width() == picker_width
    assert geometry(qtbot, window) == before
    qtbot.waitUntil(lambda: window.ctx.model is not None, timeout=120_000)
    qtbot.waitUntil(lambda: chat.model_picker.entries() != [], timeout=30_000)
    assert chat.model_picker.width() == picker_width
    assert geometry(qtbot, window) == before
