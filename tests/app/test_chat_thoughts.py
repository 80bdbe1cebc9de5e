"""A reasoning model in the chat: its thoughts arrive apart from the answer, are shown
folded ("Thinking…" while they stream, "Thoughts" after), saved apart in the store, and
never sent back to the model as the answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.context import AppContext
from app.store import ChatStore
from app.views.main_window import MainWindow
from tests.app.conftest import connected
from tests.engine.server.live import LiveServer
from tests.engine.server.test_reasoning import QUICK, THOUGHT
from tests.engine.server.test_reasoning import thinker as thinker  # the served model
from tests.engine.server.test_reasoning import thinker_dir as thinker_dir


@pytest.fixture
def window(qtbot, paths, thinker: LiveServer) -> Iterator[MainWindow]:
    gen: Any = connected(qtbot, paths, (thinker.url, ""))
    ctx: AppContext = next(gen)
    ctx.settings.set_value("welcome/shown", True)
    ctx.settings.set_value("chat/system_prompt", "")  # the script's prompt has no system turn
    ctx.settings.set_value("chat/sampling", {"temperature": 0.0, "max_tokens": 100})
    ctx.store = ChatStore(paths.chats_db)
    win = MainWindow(ctx)
    qtbot.addWidget(win)
    win.show()
    yield win
    ctx.store.close()
    next(gen, None)


def test_thoughts_are_folded_above_the_answer_and_saved_apart(qtbot, window: MainWindow):
    chat: Any = window.show_view("chat")
    with qtbot.waitSignal(chat.answer_finished, timeout=60_000) as done:
        chat.send("What is two plus two?")
    message = done.args[0]
    assert (message.state, message.content) == ("done", "It is four.")
    assert message.thoughts == THOUGHT + "\n"
    widget = chat.message_widgets()[-1]
    assert widget.text() == "It is four."
    assert widget.thoughts_button.isVisible() and widget.thoughts_button.text() == "Thoughts"
    assert not widget.thoughts.isVisible()  # folded
    widget.thoughts_button.click()
    assert widget.thoughts.isVisible() and widget.thoughts.source_text == THOUGHT + "\n"
    # reopened from the store (a relaunch): the same fold
    reloaded = chat.store.message(message.id)
    assert reloaded is not None and reloaded.thoughts == THOUGHT + "\n"


def test_the_think_switch_asks_the_template_to_skip_the_thoughts(qtbot, window: MainWindow):
    chat: Any = window.show_view("chat")
    think = chat.settings.think
    assert not think.isHidden() and think.isChecked()  # the template takes the switch
    think.setChecked(False)
    assert chat.settings.sampling()["chat_template_kwargs"] == {"enable_thinking": False}
    with qtbot.waitSignal(chat.answer_finished, timeout=60_000) as done:
        chat.send(QUICK[0]["content"])
    message = done.args[0]
    assert (message.content, message.thoughts) == ("Four.", "")
    assert not chat.message_widgets()[-1].thoughts_button.isVisible()
