"""Python syntax colours for the code pane, taken from the palette (light and dark alike).

Keywords, names after ``def``/``class``, decorators and numbers are marked first; strings
and comments are then found in one left-to-right scan (a ``#`` inside a string is not a
comment, a quote inside a comment starts no string) and painted over them. Triple-quoted
strings carry on across lines through the block state.
"""

from __future__ import annotations

import keyword
import re

from PySide6.QtGui import QFont, QPalette, QSyntaxHighlighter, QTextCharFormat, QTextDocument

_KEYWORDS = re.compile(r"\b(?:" + "|".join([*keyword.kwlist, *keyword.softkwlist]) + r")\b")
_DEFINED = re.compile(r"\b(?:def|class)\s+([A-Za-z_]\w*)")
_DECORATOR = re.compile(r"^\s*(@[\w.]+)")
_NUMBER = re.compile(r"\b(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|"
                     r"\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?[jJ]?)\b")
_STRING_OR_COMMENT = re.compile(
    r"(?P<comment>#.*)"
    r"|(?P<triple>\b[rRbBuUfF]{0,2}(?:'''|\"\"\"))"
    r"|(?P<string>\b[rRbBuUfF]{0,2}(?:'(?:\\.|[^'\\])*'?|\"(?:\\.|[^\"\\])*\"?))"
    r"|(?P<bare_triple>'''|\"\"\")"
    r"|(?P<bare_string>'(?:\\.|[^'\\])*'?|\"(?:\\.|[^\"\\])*\"?)")

#: Block states: inside a ''' string, inside a """ string.
_IN_SINGLE, _IN_DOUBLE = 1, 2
_DELIMITERS = {_IN_SINGLE: "'''", _IN_DOUBLE: '"""'}


def _format(palette: QPalette, role: QPalette.ColorRole | None, *, bold: bool = False,
            italic: bool = False) -> QTextCharFormat:
    fmt = QTextCharFormat()
    if role is not None:
        fmt.setForeground(palette.color(role))
    if bold:
        fmt.setFontWeight(QFont.Weight.Bold)
    fmt.setFontItalic(italic)
    return fmt


class PythonHighlighter(QSyntaxHighlighter):
    """Keywords, strings, comments, numbers, decorators and defined names."""

    def __init__(self, document: QTextDocument, palette: QPalette) -> None:
        super().__init__(document)
        self.set_palette(palette)

    def set_palette(self, palette: QPalette) -> None:
        """Colours from ``palette`` (call again when the system theme changes)."""
        roles = QPalette.ColorRole
        self.keyword = _format(palette, roles.Link, bold=True)
        self.defined = _format(palette, None, bold=True)
        self.decorator = _format(palette, roles.LinkVisited, italic=True)
        self.number = _format(palette, roles.Link)
        self.string = _format(palette, roles.LinkVisited)
        self.comment = _format(palette, roles.PlaceholderText, italic=True)
        self.rehighlight()

    def highlightBlock(self, text: str) -> None:
        for match in _KEYWORDS.finditer(text):
            self.setFormat(match.start(), match.end() - match.start(), self.keyword)
        for match in _NUMBER.finditer(text):
            self.setFormat(match.start(), match.end() - match.start(), self.number)
        for match in _DEFINED.finditer(text):
            self.setFormat(match.start(1), match.end(1) - match.start(1), self.defined)
        decorator = _DECORATOR.match(text)
        if decorator:
            self.setFormat(decorator.start(1), decorator.end(1) - decorator.start(1),
                           self.decorator)
        self.setCurrentBlockState(0)
        start = self._continue_string(text)
        if start is not None:
            self._strings_and_comments(text, start)

    def _continue_string(self, text: str) -> int | None:
        """Close a triple-quoted string left open by the line above; where to scan on
        (None: the whole line is still inside the string)."""
        state = self.previousBlockState()
        if state not in _DELIMITERS:
            return 0
        end = text.find(_DELIMITERS[state])
        if end < 0:
            self.setFormat(0, len(text), self.string)
            self.setCurrentBlockState(state)
            return None
        self.setFormat(0, end + 3, self.string)
        return end + 3

    def _strings_and_comments(self, text: str, pos: int) -> None:
        while True:
            match = _STRING_OR_COMMENT.search(text, pos)
            if match is None:
                return
            kind = match.lastgroup or ""
            if kind == "comment":
                self.setFormat(match.start(), len(text) - match.start(), self.comment)
                return
            if kind in ("triple", "bare_triple"):
                quote = match.group()[-3:]
                end = text.find(quote, match.end())
                if end < 0:
                    self.setFormat(match.start(), len(text) - match.start(), self.string)
                    self.setCurrentBlockState(_IN_SINGLE if quote == "'''" else _IN_DOUBLE)
                    return
                self.setFormat(match.start(), end + 3 - match.start(), self.string)
                pos = end + 3
                continue
            self.setFormat(match.start(), match.end() - match.start(), self.string)
            pos = max(match.end(), match.start() + 1)
