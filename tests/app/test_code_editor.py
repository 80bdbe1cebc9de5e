"""The code editor's ghost text on its own (no worker): a suggestion of several lines makes
room for itself instead of covering the code below, and never touches the document."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.views.code_editor import CodeEditor

CODE = "def total(items):\n    s = 0\n    for i in range(\n    return s\n"
AT = CODE.index("range(") + len("range(")


def make_editor(qtbot, text: str = CODE, at: int = AT) -> CodeEditor:
    editor = CodeEditor()
    qtbot.addWidget(editor)
    editor.resize(520, 300)
    editor.show()
    editor.setPlainText(text)
    cursor = editor.textCursor()
    cursor.setPosition(at)
    editor.setTextCursor(cursor)
    return editor


def line_top(editor: CodeEditor, number: int) -> float:
    block = editor.document().findBlockByNumber(number)
    return editor.blockBoundingGeometry(block).translated(editor.contentOffset()).top()


def test_a_suggestion_of_three_lines_pushes_the_code_below_down_and_esc_puts_it_back(qtbot):
    editor = make_editor(qtbot)
    height = editor.fontMetrics().lineSpacing()
    before = line_top(editor, 3)  # "    return s"
    undo_steps = editor.document().availableUndoSteps()

    suggestion = "len(items)):\n        s += items[i]\n        print(s)"
    editor.set_ghost(suggestion)
    qtbot.wait(10)
    assert line_top(editor, 3) >= before + 2 * height - 1  # two more lines above it
    assert editor.toPlainText() == CODE  # the document is untouched
    assert editor.document().availableUndoSteps() == undo_steps
    assert editor.textCursor().position() == AT

    qtbot.keyClick(editor, Qt.Key.Key_Escape)
    assert editor.ghost == ""
    assert line_top(editor, 3) == before
    assert editor.toPlainText() == CODE

    editor.set_ghost(suggestion)
    qtbot.keyClick(editor, Qt.Key.Key_Tab)
    assert editor.toPlainText() == CODE[:AT] + suggestion + CODE[AT:]
    assert line_top(editor, 5) == before + 2 * height  # now real lines, laid out once


def test_the_rest_of_the_line_keeps_its_colours_beside_a_mid_line_suggestion(qtbot):
    line = "y = foo() or None\n"
    at = len("y = foo(")
    editor = make_editor(qtbot, line, at=at)
    block = editor.document().firstBlock()
    starts = sorted(r.start for r in block.layout().formats())
    assert [s for s in starts if s > at], "the highlighter colours 'or' and 'None'"

    editor.set_ghost("bar, 2")
    ghost = len("bar, 2")
    # the highlighter's ranges after the cursor moved right with the text they colour
    moved = sorted(r.start for r in block.layout().formats() if r.start > at)
    assert moved == [s + ghost for s in starts if s >= at]
    editor.set_ghost("")
    assert sorted(r.start for r in block.layout().formats()) == starts
    assert editor.toPlainText() == line


def test_moving_the_cursor_or_typing_drops_the_suggestion_and_its_room(qtbot):
    editor = make_editor(qtbot)
    before = line_top(editor, 3)
    editor.set_ghost("len(items)):\n        s += items[i]")
    assert line_top(editor, 3) > before
    qtbot.keyClick(editor, Qt.Key.Key_Left)
    assert editor.ghost == "" and line_top(editor, 3) == before

    cursor = editor.textCursor()
    cursor.setPosition(AT)
    editor.setTextCursor(cursor)
    editor.set_ghost("len(items)):\n        s += items[i]")
    qtbot.keyClicks(editor, "n")
    assert editor.ghost == "" and line_top(editor, 3) == before
    assert editor.toPlainText() == CODE[:AT] + "n" + CODE[AT:]


def test_a_suggestion_inside_a_keyword_splits_its_colour_and_takes_none_of_it(qtbot):
    at = len("    ret")
    editor = make_editor(qtbot, "    return value\n", at=at)
    editor.set_ghost("GHOST")
    formats = editor.document().firstBlock().layout().formats()
    bold = sorted((r.start, r.length) for r in formats if r.format.fontWeight() > 400)
    assert bold == [(4, 3), (at + 5, 3)]  # "ret" and "urn", around the ghost
    over_ghost = [r for r in formats if r.start < at + 5 and r.start + r.length > at]
    assert len(over_ghost) == 1 and over_ghost[0].format.fontWeight() <= 400
