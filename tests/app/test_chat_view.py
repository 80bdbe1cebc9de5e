"""The chat view against the real worker (forged slow-coder: random text, ~7 ms a token,
a 1024-token context): streaming, stop, regenerate, edit, export, the context notice."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QPushButton

from app.store import ChatStore, Message
from app.views import chat_list, chat_view
from app.views.chat_message import MessageWidget
from app.views.chat_view import ChatView
from tests.app.conftest import SLOW, answers_of, start_worker

ANSWER_MS = 60_000


@pytest.fixture
def view(qtbot, ctx, paths):
    ctx.store = ChatStore(paths.chats_db)
    widget = ChatView(ctx)
    qtbot.addWidget(widget)
    widget.resize(900, 600)
    widget.show()
    widget.settings.temperature.setValue(0.0)
    widget.settings.max_tokens.setValue(24)
    yield widget
    widget.stop()


def answer(qtbot, view: ChatView, start) -> Message:
    """Run ``start()`` and wait for the answer it starts to end; the final message."""
    with qtbot.waitSignal(view.answer_finished, timeout=ANSWER_MS) as finished:
        assert start() is not False
    return finished.args[0]


def texts(view: ChatView) -> list[tuple[str, str]]:
    return [(w.message.role, w.text()) for w in view.message_widgets()]


def test_answer_streams_in_pieces_is_saved_and_counts_tokens(qtbot, view):
    view.settings.max_tokens.setValue(60)
    seen: list[int] = []
    probe = QTimer(view)
    probe.timeout.connect(lambda: seen.append(len(view.message_widgets()[-1].text())
                                              if view.message_widgets() else 0))
    probe.start(5)
    qtbot.keyClicks(view.input, "hello there")
    final = answer(qtbot, view, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Return))
    probe.stop()
    growth = sorted({n for n in seen if n})
    assert len(growth) >= 3, f"the answer did not arrive in pieces: {growth}"
    assert final.state == "done" and final.content
    assert view.input.toPlainText() == ""
    stored = view.store.messages(view.current_conversation_id())
    assert [(m.role, m.content) for m in stored] == [("user", "hello there"),
                                                     ("assistant", final.content)]
    assert texts(view) == [("user", "hello there"), ("assistant", final.content)]
    info = view.message_widgets()[-1].info.text()
    assert f"answer {final.tokens} tokens" in info and "prompt" in info
    assert final.tokens and final.tokens > 1
    assert view.conversations.model.rowCount() == 1
    assert view.store.conversation(view.current_conversation_id()).title == "hello there"


def test_escape_stops_mid_answer_and_keeps_the_text(qtbot, view, monkeypatch):
    monkeypatch.setattr(view.settings, "sampling", answers_of(400))
    with qtbot.waitSignal(view.answer_started):
        view.send("write a lot")
    qtbot.waitUntil(lambda: len(view.message_widgets()[-1].text()) > 5, timeout=ANSWER_MS)
    final = answer(qtbot, view, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Escape))
    assert final.state == "stopped"
    assert final.content and final.tokens is None
    assert view.message_widgets()[-1].text() == final.content
    assert "stopped" in view.message_widgets()[-1].info.text()
    assert view.send_button.isEnabled() and not view.stop_button.isEnabled()
    # regenerate right after a stop (the worker may still be closing that turn)
    monkeypatch.setattr(view.settings, "sampling", answers_of(16))
    again = answer(qtbot, view, view.regenerate)
    assert again.state == "done" and again.id != final.id
    assert [m.role for m in view.store.messages(view.current_conversation_id())] == [
        "user", "assistant"]


def test_regenerate_replaces_the_last_answer(qtbot, view):
    view.settings.temperature.setValue(1.0)
    first = answer(qtbot, view, lambda: view.send("say something"))
    second = answer(qtbot, view, lambda: qtbot.mouseClick(view.regen_button,
                                                          Qt.MouseButton.LeftButton))
    assert second.state == "done" and second.id != first.id
    stored = view.store.messages(view.current_conversation_id())
    assert [m.id for m in stored][1:] == [second.id]
    assert texts(view) == [("user", "say something"), ("assistant", second.content)]


def test_edit_a_message_and_resend_drops_what_followed(qtbot, view):
    answer(qtbot, view, lambda: view.send("first question"))
    later = answer(qtbot, view, lambda: view.send("second question"))
    first_widget = view.message_widgets()[0]
    qtbot.mouseClick(first_widget.edit_button, Qt.MouseButton.LeftButton)
    assert view.input.toPlainText() == "first question"
    assert view.editing_label.isVisible()
    view.input.selectAll()
    qtbot.keyClicks(view.input, "first question, edited")
    final = answer(qtbot, view, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Return))
    assert final.state == "done"
    stored = view.store.messages(view.current_conversation_id())
    assert [(m.role, m.content) for m in stored] == [("user", "first question, edited"),
                                                     ("assistant", final.content)]
    assert view.store.message(later.id) is None
    assert texts(view) == [("user", "first question, edited"), ("assistant", final.content)]
    assert not view.editing_label.isVisible()


def test_export_markdown_and_json(qtbot, view, tmp_path, monkeypatch):
    final = answer(qtbot, view, lambda: view.send("export me"))
    targets = iter([tmp_path / "chat.md", tmp_path / "chat.json"])
    monkeypatch.setattr(chat_view, "ask_save_path", lambda parent, suggested: next(targets))
    with qtbot.waitSignal(view.exported, timeout=10_000):
        view.export("markdown")
    markdown = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert "export me" in markdown and final.content.strip()[:20] in markdown
    with qtbot.waitSignal(view.exported, timeout=10_000):
        view.export("json")
    data = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
    assert [(m["role"], m["content"]) for m in data["messages"]] == [
        ("user", "export me"), ("assistant", final.content)]


def test_a_history_too_long_for_the_context_shows_a_notice_and_cuts_nothing(qtbot, view):
    long_text = " ".join(f"word{i}" for i in range(800))  # ~5000 characters
    final = answer(qtbot, view, lambda: view.send(long_text))
    assert final.state == "failed"
    assert view.banner.isVisible()
    notice = view.banner.text.text()
    assert "1024" in notice  # the model's context, in numbers
    history = int(notice.split("the history is ")[1].split(" tokens")[0])
    assert history > 1024
    assert view.banner.new_button.isVisible()
    assert not view.banner.drop_button.isVisible()  # one message: nothing older to drop
    stored = view.store.messages(view.current_conversation_id())
    assert [(m.role, m.content) for m in stored] == [("user", long_text)]  # nothing cut
    old = view.current_conversation_id()
    qtbot.mouseClick(view.banner.new_button, Qt.MouseButton.LeftButton)
    assert view.current_conversation_id() != old
    assert view.input.toPlainText() == long_text


def test_leaving_older_messages_out_makes_room_and_deletes_nothing(qtbot, view, tmp_path,
                                                                   monkeypatch):
    first = answer(qtbot, view, lambda: view.send(" ".join(f"p{i}" for i in range(150))))
    assert first.state == "done"
    # ~490 + ~690 tokens: each fits alone, both together do not
    failed = answer(qtbot, view, lambda: view.send(" ".join(f"q{i}" for i in range(200))))
    assert failed.state == "failed" and view.banner.isVisible()
    assert view.banner.drop_button.isVisible()
    conv = view.current_conversation_id()
    before = [(m.role, m.content) for m in view.store.messages(conv)]
    assert len(before) == 3  # nothing dropped
    final = answer(qtbot, view, lambda: qtbot.mouseClick(view.banner.drop_button,
                                                         Qt.MouseButton.LeftButton))
    assert final.state == "done" and final.content
    after = [(m.role, m.content) for m in view.store.messages(conv)]
    assert after == before + [("assistant", final.content)]  # every earlier row is kept
    assert not view.banner.isVisible()
    widgets = view.message_widgets()
    assert [w.left_out for w in widgets] == [True, True, False, False]
    assert widgets[0].left_out_label.isVisible() and not widgets[2].left_out_label.isVisible()
    # the export keeps them too, saying they were not sent
    targets = iter([tmp_path / "chat.md", tmp_path / "chat.json"])
    monkeypatch.setattr(chat_view, "ask_save_path", lambda parent, suggested: next(targets))
    for kind in ("markdown", "json"):
        with qtbot.waitSignal(view.exported, timeout=10_000):
            view.export(kind)
    markdown = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert "p149" in markdown and markdown.count("(not sent to the model)") == 2
    data = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
    assert [m["sent_to_model"] for m in data["messages"]] == [False, False, True, True]
    # a new view (as after a restart) still marks them
    reopened = ChatView(view.ctx)
    qtbot.addWidget(reopened)
    reopened.open_conversation(conv)
    assert [w.left_out for w in reopened.message_widgets()] == [True, True, False, False]


def test_context_banner_buttons_never_delete_what_the_user_wrote(qtbot, view):
    """Regression: "Drop oldest messages" deleted six earlier messages, then said the last
    message alone was too long. Every button of the banner, rows counted before and after."""
    for n in range(3):
        done = answer(qtbot, view, lambda n=n: view.send(f"short message {n}"))
        assert done.state == "done"
    conv = view.current_conversation_id()
    long_text = " ".join(f"word{i}" for i in range(800))  # alone more than the context
    failed = answer(qtbot, view, lambda: view.send(long_text))
    assert failed.state == "failed" and view.banner.isVisible()
    rows = [(m.role, m.content) for m in view.store.messages(conv)]
    assert len(rows) == 7 and rows[-1] == ("user", long_text)
    # leaving older messages out cannot help (the last alone does not fit): not offered
    assert not view.banner.drop_button.isVisible()
    assert "last message alone" in view.banner.text.text()
    assert view.drop_oldest() is False  # nor does the action run when called directly
    assert [(m.role, m.content) for m in view.store.messages(conv)] == rows
    buttons = [b for b in view.banner.findChildren(QPushButton) if b.isVisible()]
    assert {b.objectName() for b in buttons} == {"bannerNewChat", "bannerDismiss"}
    for name in ("bannerDismiss", "bannerNewChat"):
        view.open_conversation(conv)
        view.banner.show_overflow(1500, 1024, False)
        button = view.banner.findChild(QPushButton, name)
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
        assert [(m.role, m.content) for m in view.store.messages(conv)] == rows, name
    assert view.current_conversation_id() != conv  # New chat opened another one
    assert view.input.toPlainText() == long_text


def test_history_is_kept_and_an_interrupted_answer_says_so(qtbot, ctx, paths, view):
    final = answer(qtbot, view, lambda: view.send("keep this"))
    conv_id = view.current_conversation_id()
    ghost = view.store.add_message(conv_id, "assistant", "half an ans", state="streaming")
    ctx.store = ChatStore(paths.chats_db)  # as after a restart (or a crash)
    reopened = ChatView(ctx)
    qtbot.addWidget(reopened)
    assert reopened.current_conversation_id() == conv_id
    assert texts(reopened) == [("user", "keep this"), ("assistant", final.content),
                               ("assistant", "half an ans")]
    assert "interrupted" in reopened.message_widgets()[-1].info.text()
    assert ghost.id == reopened.message_widgets()[-1].message_id


def test_conversation_list_new_rename_search_delete(qtbot, view, monkeypatch):
    answer(qtbot, view, lambda: view.send("about apples"))
    apples = view.current_conversation_id()
    pears = view.new_conversation()
    assert pears != apples and view.message_widgets() == []
    assert view.new_conversation() == pears  # an empty chat is reused, not duplicated
    view.conversations.rename(pears, "Pears")
    assert view.title.text() == "Pears"
    view.conversations.search.setText("apples")  # content, not only titles
    qtbot.waitUntil(lambda: view.conversations.model.rowCount() == 1)
    assert view.conversations.model.conversation_at(0).id == apples
    view.conversations.search.clear()
    qtbot.waitUntil(lambda: view.conversations.model.rowCount() == 2)
    view.conversations.select(apples)
    assert view.current_conversation_id() == apples
    monkeypatch.setattr(chat_list, "confirm", lambda parent, text: True)
    qtbot.mouseClick(view.conversations.delete_button, Qt.MouseButton.LeftButton)
    assert view.store.conversation(apples) is None
    assert view.current_conversation_id() == pears


def test_a_new_conversation_samples_as_the_built_in_model_likes(qtbot, ctx, paths):
    """Temperature 0.2, top-p 0.9 and a mild repetition penalty for a fresh install; the
    penalty is a field of the panel, saved with the conversation; the worker answers with it."""
    ctx.store = ChatStore(paths.chats_db)
    fresh = ChatView(ctx)
    qtbot.addWidget(fresh)
    sampling = fresh.settings.sampling()
    assert (sampling["temperature"], sampling["top_p"]) == (0.2, 0.9)
    assert sampling["repetition_penalty"] == 1.1
    fresh.settings.repetition_penalty.setValue(1.3)
    fresh.settings.max_tokens.setValue(8)
    answer(qtbot, fresh, lambda: fresh.send("hi"))
    conv_id = fresh.current_conversation_id()
    assert conv_id is not None
    saved = fresh.store.conversation(conv_id)
    assert saved is not None and saved.sampling["repetition_penalty"] == 1.3
    fresh.stop()


def test_sampling_and_system_prompt_are_saved_per_conversation(qtbot, view):
    answer(qtbot, view, lambda: view.send("hi"))
    conv_id = view.current_conversation_id()
    view.settings.temperature.setValue(0.3)
    view.settings.system_prompt.setPlainText("Answer in French.")
    saved = view.store.conversation(conv_id)
    assert saved.sampling["temperature"] == 0.3 and saved.sampling["max_tokens"] == 24
    assert saved.system_prompt == "Answer in French."
    other = view.new_conversation()
    assert view.settings.system_prompt.toPlainText() == view.ctx.settings.system_prompt
    view.open_conversation(conv_id)
    assert view.settings.temperature.value() == pytest.approx(0.3)
    assert other != conv_id


def test_code_blocks_render_monospace_with_a_copy_link(qtbot):
    message = Message(1, 1, 0, "assistant", "Here:\n\n```python\nprint('hi')\n```\nDone.",
                      "done", 5, 9, "", 0.0, 0.0)
    widget = MessageWidget(message)
    qtbot.addWidget(widget)
    shown = widget.body.toPlainText()
    assert "Copy code" in shown and "print('hi')" in shown and "```" not in shown
    widget.body.anchorClicked.emit(QUrl("copy:0"))
    assert QGuiApplication.clipboard().text() == "print('hi')"


def test_worker_dying_mid_answer_keeps_the_text_and_the_next_send_works(
        qtbot, ctx, paths, models_root, live_worker, tmp_path, monkeypatch):
    home = tmp_path / "own-worker"
    home.mkdir()
    proc, ready = start_worker(models_root / SLOW, [models_root], home)
    try:
        ctx.client.configure(ready["url"], None, ready["admin_token"])
        ctx.store = ChatStore(paths.chats_db)
        view = ChatView(ctx)
        qtbot.addWidget(view)
        view.show()
        monkeypatch.setattr(view.settings, "sampling", answers_of(400))
        with qtbot.waitSignal(view.answer_started):
            view.send("talk for a while")
        qtbot.waitUntil(lambda: len(view.message_widgets()[-1].text()) > 5, timeout=ANSWER_MS)
        with qtbot.waitSignal(view.answer_finished, timeout=ANSWER_MS) as finished:
            proc.kill()
        broken: Message = finished.args[0]
    finally:
        proc.kill()
        proc.wait(10)
    assert broken.state == "failed" and broken.note.startswith("interrupted: the worker stopped")
    assert broken.content and view.message_widgets()[-1].text() == broken.content
    assert "interrupted" in view.message_widgets()[-1].info.text()
    ctx.down.emit("the worker exited")
    assert view.notice.isVisible()
    url, token = live_worker  # "restarted": the app's builder reconfigures, then ready
    ctx.client.configure(url, None, token)
    ctx.ready.emit()
    assert not view.notice.isVisible()
    monkeypatch.setattr(view.settings, "sampling", answers_of(16))
    final = answer(qtbot, view, lambda: view.send("are you back?"))
    assert final.state == "done" and final.content
    conv_id = view.current_conversation_id()
    assert conv_id is not None
    assert [m.role for m in view.store.messages(conv_id)] == [
        "user", "assistant", "user", "assistant"]


def test_keyboard_shift_enter_is_a_new_line_and_ctrl_l_focuses_the_input(qtbot, view):
    qtbot.keyClicks(view.input, "line one")
    qtbot.keyClick(view.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(view.input, "line two")
    assert view.input.toPlainText() == "line one\nline two"
    assert view.message_widgets() == []  # nothing was sent
    view.activateWindow()
    qtbot.waitUntil(view.isActiveWindow)
    view.conversations.search.setFocus()
    qtbot.waitUntil(view.conversations.search.hasFocus)
    qtbot.keyClick(view.conversations.search, Qt.Key.Key_L,
                   Qt.KeyboardModifier.ControlModifier)
    assert view.input.hasFocus()


def test_the_chat_that_was_open_is_open_again_after_a_relaunch(qtbot, ctx, paths, view):
    older = view.new_conversation()
    answer(qtbot, view, lambda: view.send("the older chat"))
    view.new_conversation()
    answer(qtbot, view, lambda: view.send("the newer chat"))
    view.conversations.select(older)  # the user goes back to the older one
    assert view.current_conversation_id() == older
    ctx.store = ChatStore(paths.chats_db)  # as after a quit and a relaunch
    reopened = ChatView(ctx)
    qtbot.addWidget(reopened)
    assert reopened.current_conversation_id() == older
    assert reopened.conversations.current_id() == older
    assert texts(reopened)[0] == ("user", "the older chat")


def test_the_worker_stopped_notice_says_why_without_brackets_in_brackets(qtbot, ctx, view):
    from app.worker import diagnose

    reason = diagnose(-9, True, [])
    assert "(" in reason  # the diagnosis has brackets of its own
    ctx.down.emit(reason)
    said = view.notice.text()
    assert reason in said
    depth = deepest = 0
    for char in said:
        depth += {"(": 1, ")": -1}.get(char, 0)
        deepest = max(deepest, depth)
    assert deepest <= 1, said



def test_the_request_after_leaving_older_messages_out_reuses_the_kept_history(qtbot, view):
    """What "Leave older messages out" sends is answered like a normal turn: the kept
    exchange's KV is reused from where it sat before (the worker's usage says how much),
    only the new message is computed. Before, a kept history under 256 tokens was all
    computed again."""
    ends: list = []
    on_ended = view._on_ended

    def record(end):  # the worker's usage of each answer
        ends.append(end)
        on_ended(end)

    view._on_ended = record
    for name in ("a", "b"):  # two exchanges of ~150 tokens
        done = answer(qtbot, view, lambda name=name: view.send(
            " ".join(f"{name}{i}" for i in range(45))))
        assert done.state == "done"
    normal = ends[-1].usage
    kept = normal["prompt_tokens"] - normal["prompt_tokens_details"]["cached_tokens"] \
        + normal["completion_tokens"]  # the second exchange, as sent again
    failed = answer(qtbot, view, lambda: view.send(" ".join(f"c{i}" for i in range(205))))
    assert failed.state == "failed" and view.banner.drop_button.isVisible()
    final = answer(qtbot, view, lambda: qtbot.mouseClick(view.banner.drop_button,
                                                         Qt.MouseButton.LeftButton))
    assert final.state == "done"
    assert [w.left_out for w in view.message_widgets()] == [True, True, False, False,
                                                            False, False]
    usage = ends[-1].usage
    assert usage["prompt_tokens"] > 600
    assert usage["prompt_tokens_details"]["cached_tokens"] >= kept * 3 // 4, (normal, usage)
