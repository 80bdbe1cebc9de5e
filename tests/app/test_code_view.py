"""The code pane against a real worker: ghost text appears after typing, Tab inserts it at
the cursor, Esc drops it, newer requests win, and failures read as words."""

from __future__ import annotations

import re
from pathlib import Path

import shiboken6
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from app.client import JsonReply
from app.context import AppContext
from app.paths import AppPaths
from app.views.code_view import CodeView, fim_context
from tests.app.conftest import start_worker


def make_view(qtbot, ctx: AppContext, *, debounce_ms: int = 30,
              n_predict: int = 16) -> CodeView:
    view = CodeView(ctx)
    qtbot.addWidget(view)
    view.debounce_ms = debounce_ms
    view.n_predict = n_predict
    view.resize(700, 400)
    view.show()
    view.editor.setFocus()
    return view


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def test_typing_shows_a_suggestion_and_tab_inserts_it_at_the_cursor(qtbot, ctx):
    view = make_view(qtbot, ctx)
    with qtbot.waitSignal(view.suggestion_shown, timeout=30_000) as shown:
        qtbot.keyClicks(view.editor, "math.pi")
    suggestion = shown.args[0]
    assert suggestion and view.suggestion == suggestion
    assert re.search(r"\d+ ms · \d+ tokens?", view.status.text()), view.status.text()
    assert view.last_latency_ms is not None and view.last_latency_ms > 0

    # put the cursor mid-text: the suggestion must land exactly there
    text_before = view.editor.toPlainText()
    pos = view.editor.textCursor().position()
    cursor = view.editor.textCursor()
    cursor.setPosition(pos - 3)
    view.editor.setTextCursor(cursor)
    assert view.suggestion == ""  # moving the cursor drops it
    with qtbot.waitSignal(view.suggestion_shown, timeout=30_000) as shown:
        view.request_now()
    suggestion = shown.args[0]
    at = view.editor.textCursor().position()
    qtbot.keyClick(view.editor, Qt.Key.Key_Tab)
    head = text_before[:len(text_before) - 3]
    assert view.editor.toPlainText() == head + suggestion + text_before[len(head):]
    assert view.editor.textCursor().position() == at + utf16_len(suggestion)
    assert view.suggestion == ""


def test_escape_dismisses_the_ghost_text_and_leaves_the_text(qtbot, ctx):
    view = make_view(qtbot, ctx)
    with qtbot.waitSignal(view.suggestion_shown, timeout=30_000):
        qtbot.keyClicks(view.editor, "2 *")
    text = view.editor.toPlainText()
    with_ghost = view.editor.viewport().grab().toImage()
    assert "Tab takes it" in view.status.text()
    qtbot.keyClick(view.editor, Qt.Key.Key_Escape)
    assert view.suggestion == ""
    assert view.editor.toPlainText() == text
    assert view.status.text() == "Suggestion dropped."  # it no longer offers Tab
    without = view.editor.viewport().grab().toImage()
    assert with_ghost != without  # the grey text was painted, and is gone
    qtbot.keyClick(view.editor, Qt.Key.Key_Tab)  # no suggestion: Tab indents
    assert view.editor.toPlainText() == text + "    "


def test_an_answer_after_the_pane_is_closed_is_dropped_quietly(qtbot, ctx):
    view = CodeView(ctx)  # not qtbot's to close: the test deletes it
    view.debounce_ms, view.n_predict = 60_000, 24
    view.show()
    view.request_now()
    replies = [reply for reply in ctx.client.findChildren(JsonReply) if not reply.done]
    assert view.in_flight and replies
    view.close()
    view.deleteLater()
    qtbot.waitUntil(lambda: not shiboken6.isValid(view), timeout=10_000)
    # the answer still arrives, for a pane that is gone: nothing may raise in Qt's loop
    # (pytest-qt fails the test if it does)
    qtbot.waitUntil(lambda: all(not shiboken6.isValid(reply) or reply.done
                                for reply in replies), timeout=30_000)


def test_typing_during_a_request_aborts_it_and_only_the_newest_answer_shows(qtbot, ctx):
    view = make_view(qtbot, ctx, debounce_ms=60_000, n_predict=400)  # ~3 s: surely in flight
    shown: list[str] = []
    view.suggestion_shown.connect(shown.append)
    view.request_now()
    assert view.in_flight and view.requests_sent == 1
    qtbot.keyClicks(view.editor, "x")
    assert view.requests_aborted == 1 and not view.in_flight
    view.n_predict = 16
    with qtbot.waitSignal(view.suggestion_shown, timeout=30_000):
        view.request_now()
    assert view.requests_sent == 2
    assert view.shown_request == 2
    assert shown == [view.suggestion]


def test_a_late_answer_for_an_old_cursor_is_never_shown(qtbot, ctx):
    view = make_view(qtbot, ctx, debounce_ms=60_000, n_predict=24)
    shown: list[str] = []
    view.suggestion_shown.connect(shown.append)
    view.request_now()
    view.editor.moveCursor(QTextCursor.MoveOperation.Start)  # no edit: no new request
    qtbot.waitUntil(lambda: view.answers_dropped == 1, timeout=30_000)
    assert shown == [] and view.suggestion == ""
    assert view.requests_sent == 1


def test_the_request_splits_the_text_like_llama_vim(qtbot, ctx):
    view = make_view(qtbot, ctx)
    view.editor.setPlainText("a = 1\nb = 2 + c\nprint(b)")
    cursor = view.editor.textCursor()
    cursor.setPosition(len("a = 1\nb = 2"))
    view.editor.setTextCursor(cursor)
    fim = fim_context(view.editor)
    assert (fim.prefix, fim.prompt, fim.suffix) == ("a = 1\n", "b = 2", " + c\nprint(b)\n")


def test_an_unreachable_worker_reads_as_words(qtbot, paths: AppPaths):
    ctx = AppContext(paths)
    ctx.client.configure("http://127.0.0.1:9")  # discard port: nothing listens
    view = make_view(qtbot, ctx)
    view.request_now()
    qtbot.waitUntil(lambda: "unreachable" in view.status.text(), timeout=15_000)
    assert view.suggestion == ""


def test_no_model_reads_as_words(qtbot, paths: AppPaths, app_home: Path,
                                 models_root: Path):
    proc, ready = start_worker(None, [models_root], app_home)
    try:
        ctx = AppContext(paths)
        ctx.client.configure(ready["url"], None, ready["admin_token"])
        view = make_view(qtbot, ctx)
        view.request_now()
        qtbot.waitUntil(lambda: "No model" in view.status.text(), timeout=15_000)
        assert view.suggestion == ""
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_suggestion_that_ends_in_a_loop_is_kept_once():
    from app.views.code_view import trim_repetition

    assert trim_repetition("len(len(len(len(len(le") == "len("
    assert trim_repetition("x = 1\n" + "e.g." * 6) == "x = 1\ne.g."
    # real repeats are code, not loops: kept
    for code in ("[0, 0, 0, 0]", "1000000", "# ---------", "a = 1\nb = 2", "values)):"):
        assert trim_repetition(code) == code


def test_a_suggestion_leaves_out_lines_that_are_only_a_code_fence():
    from app.views.code_view import drop_fences

    assert drop_fences("x = 1;\n```\nconsole.log(x);") == "x = 1;\nconsole.log(x);"
    assert drop_fences("```javascript\nlet a = 2;\n  ```  \n") == "let a = 2;\n"
    assert drop_fences("~~~\ny") == "y"
    # a fence inside code (a Markdown string, a comment) is code: kept
    for code in ('s = "```"', "# ``` fences", "x = 1\n\ny = 2"):
        assert drop_fences(code) == code


def test_a_mid_line_suggestion_is_one_line_without_the_text_already_there():
    from app.views.code_view import fit_mid_line

    assert fit_mid_line("len(values)):", ":") == "len(values))"
    assert fit_mid_line("len(values)):\n        total += 1", "):") == "len(values)"
    assert fit_mid_line("x + c", " + c") == "x"
    assert fit_mid_line("values", ")") == "values"  # no overlap: kept whole
    assert fit_mid_line(":", ":") == ""  # nothing new to offer


def test_mid_line_the_worker_is_asked_for_one_line(qtbot, ctx):
    view = make_view(qtbot, ctx)
    before, after = "def mean(values):\n    for i in range(", ":\n        pass\n"
    view.editor.setPlainText(before + after)
    cursor = view.editor.textCursor()
    cursor.setPosition(len(before))
    view.editor.setTextCursor(cursor)
    sent: list[dict] = []
    call = view.ctx.client.call

    def spy(method, path, body=None, **kw):  # the real call, with the body kept
        sent.append(body)
        return call(method, path, body, **kw)

    view.ctx.client.call = spy  # type: ignore[method-assign]
    view.request_now()
    qtbot.waitUntil(lambda: not view.in_flight, timeout=30_000)
    assert sent[0]["stop"] == ["\n"] and sent[0]["input_suffix"].startswith(":\n")
    assert re.match(r"(Suggestion in|No suggestion here) ", view.status.text()), \
        view.status.text()  # the worker took the request (no error)
    assert "\n" not in view.suggestion and not view.suggestion.endswith(":")
    # at the end of a line the suggestion may run over several lines: no stop is sent
    view.editor.setPlainText("def mean(values):\n")
    view.editor.moveCursor(QTextCursor.MoveOperation.End)
    view.request_now()
    qtbot.waitUntil(lambda: not view.in_flight, timeout=30_000)
    assert "stop" not in sent[1]
