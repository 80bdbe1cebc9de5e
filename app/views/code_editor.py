"""The code pane's editor: monospace text, a line-number gutter, Python colours, and a
suggestion shown as grey "ghost" text at the cursor (Tab takes it, Esc drops it).

The ghost text is never put in the document: undo, the text and the cursor stay the
user's. It is laid out in the cursor's line as Qt lays out an input method's uncommitted
text (the block layout's preedit area): the rest of that line moves right of it, and a
suggestion of several lines pushes the lines below down, as editors show multi-line
completions, instead of covering them.
"""

from __future__ import annotations

import re

from PySide6.QtCore import QEvent, QRect, QSize, Qt, Signal
from PySide6.QtGui import (
    QFontDatabase,
    QKeyEvent,
    QPainter,
    QPaintEvent,
    QPalette,
    QResizeEvent,
    QTextBlock,
    QTextCharFormat,
    QTextCursor,
    QTextFormat,
    QTextLayout,
)
from PySide6.QtWidgets import QPlainTextEdit, QTextEdit, QWidget

from app.views.code_highlight import PythonHighlighter

TAB_WIDTH = 4
_DEDENT = re.compile(r"^\s*(return|pass|break|continue|raise)\b")
_OPENERS = {"python": (":",), "c-like": ("{", "(", "["), "text": ()}


def next_indent(before: str, language: str = "python") -> str:
    """The indentation of a new line after ``before`` (its line up to the cursor)."""
    indent = before[:len(before) - len(before.lstrip())]
    code = before.split("#", 1)[0] if language == "python" else before
    code = code.rstrip()
    openers = _OPENERS.get(language, _OPENERS["c-like"]) + (("(", "[", "{")
                                                              if language == "python" else ())
    if code and code.endswith(openers):
        unit = "\t" if indent.startswith("\t") else " " * TAB_WIDTH
        return indent + unit
    if language == "python" and _DEDENT.match(code) and indent:
        return indent[:-TAB_WIDTH] if indent.endswith(" " * TAB_WIDTH) else indent[:-1]
    return indent


class LineNumbers(QWidget):
    """The gutter left of the text: one number per line, the current one in full text
    colour, the others in the palette's placeholder grey."""

    def __init__(self, editor: CodeEditor) -> None:
        super().__init__(editor)
        self.setObjectName("codeLineNumbers")
        self._editor = editor

    def sizeHint(self) -> QSize:
        return QSize(self._editor.gutter_width(), 0)

    def paintEvent(self, event: QPaintEvent) -> None:
        editor = self._editor
        painter = QPainter(self)
        palette = self.palette()
        painter.fillRect(event.rect(), palette.color(QPalette.ColorRole.AlternateBase))
        block = editor.firstVisibleBlock()
        current = editor.textCursor().blockNumber()
        top = round(editor.blockBoundingGeometry(block).translated(
            editor.contentOffset()).top())
        height = editor.fontMetrics().height()
        while block.isValid() and top <= event.rect().bottom():
            bottom = top + round(editor.blockBoundingRect(block).height())
            if block.isVisible() and bottom >= event.rect().top():
                number = block.blockNumber()
                role = (QPalette.ColorRole.Text if number == current
                        else QPalette.ColorRole.PlaceholderText)
                painter.setPen(palette.color(role))
                painter.drawText(0, top, self.width() - 6, height,
                                 Qt.AlignmentFlag.AlignRight, str(number + 1))
            block = block.next()
            top = bottom
        painter.end()


class CodeEditor(QPlainTextEdit):
    """A plain-text editor for code with a ghost-text suggestion.

    ``set_ghost(text)`` shows ``text`` at the cursor; it goes away when the text changes,
    the cursor moves, Esc is pressed (``dismissed``) or Tab takes it (``accepted(str)``).
    """

    accepted = Signal(str)
    dismissed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeEditor")
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setTabStopDistance(self.fontMetrics().horizontalAdvance(" ") * TAB_WIDTH)
        self._ghost = ""
        self._ghost_at = -1
        self._ghost_block: QTextBlock | None = None
        self.language = "python"  # how new lines indent (app/views/code_files.py names it)
        self.highlighter = PythonHighlighter(self.document(), self.palette())
        self.gutter = LineNumbers(self)
        self.blockCountChanged.connect(self._fit_gutter)
        self.updateRequest.connect(self._scroll_gutter)
        self.cursorPositionChanged.connect(self._on_cursor_moved)
        self.document().contentsChanged.connect(self.clear_ghost)
        self._fit_gutter()
        self._on_cursor_moved()

    # --- the suggestion -------------------------------------------------------------------

    @property
    def ghost(self) -> str:
        return self._ghost

    def set_ghost(self, text: str) -> None:
        """Show ``text`` as a suggestion at the cursor ("" hides it)."""
        self._unlay_ghost()
        self._ghost = text
        self._ghost_at = self.textCursor().position() if text else -1
        if text:
            self._lay_ghost()
        self.viewport().update()

    def _lay_ghost(self) -> None:
        cursor = self.textCursor()
        block = cursor.block()
        layout = block.layout()
        at = cursor.positionInBlock()
        shown = self._ghost.replace("\r\n", "\n").replace("\n", "\u2028")  # line breaks
        ghost_format = QTextCharFormat()
        ghost_format.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
        grey = QTextLayout.FormatRange()
        grey.start, grey.length, grey.format = at, len(shown), ghost_format
        layout.setPreeditArea(at, shown)
        # (unlaying the last ghost re-highlighted the block: no ghost range is left in it)
        layout.setFormats([*_shifted(layout.formats(), at, len(shown)), grey])
        self._ghost_block = block
        self.document().markContentsDirty(block.position(), block.length())

    def _unlay_ghost(self) -> None:
        block, self._ghost_block = self._ghost_block, None
        if block is None or not block.isValid():
            return
        block.layout().setPreeditArea(-1, "")
        self.highlighter.rehighlightBlock(block)  # its colours back on the block's own text
        self.document().markContentsDirty(block.position(), block.length())

    def clear_ghost(self) -> None:
        if self._ghost:
            self.set_ghost("")

    def accept_ghost(self) -> bool:
        """Insert the suggestion at the cursor; False when there was none."""
        text = self._ghost
        if not text:
            return False
        self.clear_ghost()
        cursor = self.textCursor()
        cursor.insertText(text)
        self.setTextCursor(cursor)
        self.accepted.emit(text)
        return True

    def dismiss_ghost(self) -> bool:
        if not self._ghost:
            return False
        self.clear_ghost()
        self.dismissed.emit()
        return True

    # --- keys -------------------------------------------------------------------------------

    def event(self, event: QEvent) -> bool:
        # Tab and Esc belong to the suggestion while one shows (not to window shortcuts
        # such as "Esc stops the answer").
        if (event.type() == QEvent.Type.ShortcutOverride and self._ghost
                and isinstance(event, QKeyEvent)
                and event.key() in (Qt.Key.Key_Tab, Qt.Key.Key_Escape)):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        plain = event.modifiers() in (Qt.KeyboardModifier.NoModifier,
                                      Qt.KeyboardModifier.KeypadModifier)
        if event.key() == Qt.Key.Key_Tab and plain:
            if not self.accept_ghost():
                self.insertPlainText(" " * TAB_WIDTH)
            return
        if event.key() == Qt.Key.Key_Escape and self.dismiss_ghost():
            return
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and (
                plain or event.modifiers() == Qt.KeyboardModifier.ShiftModifier):
            self.new_line()
            return
        if event.key() == Qt.Key.Key_Backspace and plain and self._unindent():
            return
        super().keyPressEvent(event)

    # --- indentation ----------------------------------------------------------------------

    def new_line(self) -> None:
        """Break the line at the cursor, keeping its indentation: one level more after a
        line that opens a block (``def f():``, ``{``), one less after one that ends it
        (``return``, ``pass``...)."""
        cursor = self.textCursor()
        before = cursor.block().text()[:cursor.positionInBlock()]
        indent = next_indent(before, self.language)
        cursor.beginEditBlock()
        cursor.removeSelectedText()
        cursor.insertText("\n" + indent)
        cursor.endEditBlock()
        self.setTextCursor(cursor)
        self.ensureCursorVisible()

    def _unindent(self) -> bool:
        """Backspace in the indentation: back to the previous level, not one space."""
        cursor = self.textCursor()
        if cursor.hasSelection():
            return False
        before = cursor.block().text()[:cursor.positionInBlock()]
        if not before or before.strip() or "\t" in before:
            return False
        remove = len(before) % TAB_WIDTH or TAB_WIDTH
        cursor.movePosition(QTextCursor.MoveOperation.Left,
                            QTextCursor.MoveMode.KeepAnchor, remove)
        cursor.removeSelectedText()
        return True

    # --- gutter and current line ------------------------------------------------------------

    def gutter_width(self) -> int:
        digits = len(str(max(1, self.blockCount())))
        return 12 + self.fontMetrics().horizontalAdvance("9") * max(digits, 2)

    def _fit_gutter(self) -> None:
        self.setViewportMargins(self.gutter_width(), 0, 0, 0)

    def _scroll_gutter(self, rect: QRect, dy: int) -> None:
        if dy:
            self.gutter.scroll(0, dy)
        else:
            self.gutter.update(0, rect.y(), self.gutter.width(), rect.height())
        if rect.contains(self.viewport().rect()):
            self._fit_gutter()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        inner = self.contentsRect()
        self.gutter.setGeometry(QRect(inner.left(), inner.top(), self.gutter_width(),
                                      inner.height()))

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.highlighter.set_palette(self.palette())
            if self._ghost:  # its grey follows the palette
                self.set_ghost(self._ghost)
            self._on_cursor_moved()

    def _on_cursor_moved(self) -> None:
        if self._ghost and self.textCursor().position() != self._ghost_at:
            self.clear_ghost()
        selection = QTextEdit.ExtraSelection()
        selection.format.setBackground(self.palette().color(QPalette.ColorRole.AlternateBase))
        selection.format.setProperty(QTextFormat.Property.FullWidthSelection, True)
        selection.cursor = self.textCursor()
        selection.cursor.clearSelection()
        self.setExtraSelections([selection])
        self.gutter.update()


def _shifted(ranges: list[QTextLayout.FormatRange], at: int,
             inserted: int) -> list[QTextLayout.FormatRange]:
    """The highlighter's ranges (positions in the block's text) moved to positions in the
    laid-out text, where ``inserted`` characters of ghost text sit at ``at``; a range the
    ghost splits becomes two, so none of its format (a keyword's bold) reaches the ghost."""
    out = []
    for r in ranges:
        if r.start >= at:
            r.start += inserted
        elif r.start + r.length > at:
            tail = QTextLayout.FormatRange()
            tail.start, tail.length = at + inserted, r.start + r.length - at
            tail.format = r.format
            r.length = at - r.start
            out.append(tail)
        out.append(r)
    return out
