"""The Code pane as an editor: auto-indent typed with real key presses, open / save /
save as / recent through the pane's buttons (the file dialogs answered by the test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from app.views import code_files
from app.views.code_editor import CodeEditor, next_indent
from app.views.code_view import CodeView


@pytest.fixture
def pane(qtbot, ctx):
    view = CodeView(ctx)
    qtbot.addWidget(view)
    view.debounce_ms = 60_000  # no suggestion requests while these tests type
    view.resize(700, 500)
    view.show()
    return view


def type_lines(qtbot, editor: CodeEditor, *lines: str) -> None:
    for line in lines:
        qtbot.keyClicks(editor, line)
        qtbot.keyClick(editor, Qt.Key.Key_Return)


def test_return_keeps_the_indentation_and_indents_after_a_colon(qtbot, pane):
    editor = pane.editor
    editor.clear()
    type_lines(qtbot, editor, "def area(r):", "if r < 0:", "raise ValueError(r)")
    qtbot.keyClicks(editor, "x = [")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert editor.toPlainText() == ("def area(r):\n    if r < 0:\n        raise ValueError(r)\n"
                                    "    x = [\n        ")
    qtbot.keyClick(editor, Qt.Key.Key_Backspace)  # back one level, not one space
    assert editor.toPlainText().endswith("x = [\n    ")
    editor.undo()  # the line break and its indentation are one step
    assert editor.toPlainText().endswith("x = [\n        ")


def test_the_indent_rule_by_language():
    assert next_indent("    def f(x):  # a comment") == "        "
    assert next_indent("        return x") == "    "
    assert next_indent("\tif x:") == "\t\t"
    assert next_indent("int main() {", "c-like") == "    "
    assert next_indent("  note:", "text") == "  "


def test_open_edit_save_save_as_and_recent(qtbot, pane, tmp_path, monkeypatch):
    source = tmp_path / "shapes.py"
    source.write_text("import math\n", encoding="utf-8")
    monkeypatch.setattr(code_files, "ask_open_path", lambda parent, start: source)
    qtbot.mouseClick(pane.files.open_button, Qt.MouseButton.LeftButton)
    assert pane.editor.toPlainText() == "import math\n"
    assert pane.files.name.text() == f"{source} · Python"
    pane.editor.moveCursor(QTextCursor.MoveOperation.End)
    type_lines(qtbot, pane.editor, "def unit():")
    qtbot.keyClicks(pane.editor, "return 1")
    assert pane.files.name.text().startswith(f"{source} •")  # unsaved changes show
    qtbot.mouseClick(pane.files.save_button, Qt.MouseButton.LeftButton)
    assert source.read_text(encoding="utf-8") == "import math\ndef unit():\n    return 1"
    assert pane.files.name.text() == f"{source} · Python"

    copy = tmp_path / "shapes.js"
    monkeypatch.setattr(code_files, "ask_save_path", lambda parent, start: copy)
    qtbot.mouseClick(pane.files.save_as_button, Qt.MouseButton.LeftButton)
    assert copy.read_text(encoding="utf-8") == source.read_text(encoding="utf-8")
    assert pane.files.name.text() == f"{copy} · JavaScript"
    assert pane.editor.language == "c-like" and pane.editor.highlighter.document() is None
    assert pane.files.recent() == [str(copy), str(source)]
    assert [a.text() for a in pane.files.recent_menu.actions()] == [str(copy), str(source)]
    pane.files.recent_menu.actions()[1].trigger()  # back to the Python file
    assert pane.files.path == source and pane.editor.language == "python"


def test_unsaved_changes_are_kept_unless_the_user_lets_them_go(qtbot, pane, tmp_path,
                                                               monkeypatch):
    other = tmp_path / "other.py"
    other.write_text("x = 1\n", encoding="utf-8")
    qtbot.keyClicks(pane.editor, "my work")
    asked: list[str] = []

    def refuse(parent: object, name: str) -> bool:
        asked.append(name)
        return False

    monkeypatch.setattr(code_files, "confirm_discard", refuse)
    assert pane.files.open(other) is False
    assert asked and pane.editor.toPlainText().endswith("my work")


def test_a_file_that_is_not_text_is_refused_in_words(qtbot, pane, tmp_path):
    blob = tmp_path / "blob.py"
    blob.write_bytes(b"\xff\xfe\x00binary")
    before = pane.editor.toPlainText()
    assert pane.files.open(blob) is False
    assert pane.status.text() == f"{blob} is not UTF-8 text: it was not opened."
    assert pane.editor.toPlainText() == before


def test_saving_where_it_cannot_says_so_and_keeps_the_text(qtbot, pane, tmp_path,
                                                          monkeypatch):
    target = tmp_path / "missing-folder" / "a.py"
    monkeypatch.setattr(code_files, "ask_save_path", lambda parent, start: target)
    assert pane.files.save() is False
    assert pane.status.text().startswith(f"Could not save {target}")
    assert not Path(target).exists() and pane.editor.toPlainText()
