"""One message of the transcript: a header (who, tokens, state, actions) over its text,
rendered as Markdown with a "Copy code" link before each fenced code block. A reasoning
model's thoughts sit folded above its answer ("Thinking…"), opened with a click."""

from __future__ import annotations

import math
import re

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.store import Message
from app.views.chat_parts import named

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
COPY_SCHEME = "copy"


def split_code(text: str) -> tuple[list[str], list[int]]:
    """(code blocks, line index of each block's opening fence); an unterminated block runs
    to the end (a streaming answer)."""
    blocks: list[str] = []
    starts: list[int] = []
    fence = ""
    body: list[str] = []
    for i, line in enumerate(text.split("\n")):
        if not fence:
            match = _FENCE.match(line)
            if match:
                fence = match.group(1)
                starts.append(i)
                body = []
            continue
        if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
            blocks.append("\n".join(body))
            fence = ""
        else:
            body.append(line)
    if fence:
        blocks.append("\n".join(body))
    return blocks, starts


def with_copy_links(text: str) -> str:
    """``text`` with a ``[Copy code](copy:N)`` line before the N-th fenced code block."""
    _blocks, starts = split_code(text)
    if not starts:
        return text
    lines = text.split("\n")
    for n, at in reversed(list(enumerate(starts))):
        lines[at:at] = ["", f"[Copy code]({COPY_SCHEME}:{n})", ""]
    return "\n".join(lines)


class MessageBody(QTextBrowser):
    """Markdown text that grows to fit (no scroll bar of its own)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageBody")
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.anchorClicked.connect(self._on_link)
        self.source_text = ""
        self._blocks: list[str] = []

    def set_source(self, text: str) -> None:
        if text == self.source_text:
            return
        self.source_text = text
        self._blocks = split_code(text)[0]
        self.setMarkdown(with_copy_links(text))

    def code_blocks(self) -> list[str]:
        return list(self._blocks)

    def copy_block(self, n: int) -> None:
        if 0 <= n < len(self._blocks):
            QGuiApplication.clipboard().setText(self._blocks[n])

    def _fit(self, *_args: object) -> None:
        height = self.document().size().height()
        margins = self.contentsMargins()
        self.setFixedHeight(math.ceil(height) + margins.top() + margins.bottom() + 2)

    def _on_link(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            try:
                self.copy_block(int(url.path()))
            except ValueError:
                return
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)


def describe(message: Message, answering: bool) -> str:
    """The header's small print: token counts and how the answer ended."""
    parts: list[str] = []
    if message.role == "assistant":
        if message.prompt_tokens is not None:
            parts.append(f"prompt {message.prompt_tokens} tokens")
        if message.tokens is not None:
            parts.append(f"answer {message.tokens} tokens")
    if message.state == "streaming":
        parts.append("answering…" if answering else
                     "interrupted: the app closed before the answer ended")
    elif message.note:
        parts.append(message.note)
    return " · ".join(parts)


class MessageWidget(QFrame):
    """A message: "You"/"Assistant", its info line, Edit (yours) and its Markdown text."""

    edit_requested = Signal(int)  # message id

    def __init__(self, message: Message, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(f"message-{message.role}")
        self.setFrameShape(QFrame.Shape.StyledPanel if message.role == "user"
                           else QFrame.Shape.NoFrame)
        self.message = message
        who = named(QLabel("You" if message.role == "user" else "Assistant"), "messageRole")
        font = who.font()
        font.setBold(True)
        who.setFont(font)
        self.info = named(QLabel(""), "messageInfo")
        self.info.setEnabled(False)  # the palette's quieter text
        self.info.setWordWrap(True)
        self.edit_button = named(QPushButton("Edit"), "editMessage")
        self.edit_button.setFlat(True)
        self.edit_button.setVisible(message.role == "user")
        self.edit_button.clicked.connect(lambda: self.edit_requested.emit(self.message.id))
        header = QHBoxLayout()
        header.addWidget(who)
        header.addWidget(self.info, 1)
        header.addWidget(self.edit_button)
        self.left_out = False
        self.left_out_label = named(QLabel("Not sent to the model (left out to fit its "
                                           "context; kept here and in exports)"),
                                    "messageLeftOut")
        self.left_out_label.setWordWrap(True)
        self.left_out_label.hide()
        self.thoughts_button = named(QToolButton(), "thoughtsToggle")
        self.thoughts_button.setCheckable(True)
        self.thoughts_button.setAutoRaise(True)
        self.thoughts_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.thoughts_button.setArrowType(Qt.ArrowType.RightArrow)
        self.thoughts_button.toggled.connect(self._show_thoughts)
        self.thoughts_button.hide()
        self.thoughts = MessageBody(self)
        self.thoughts.setObjectName("messageThoughts")
        self.thoughts.setEnabled(False)  # the palette's quieter text: not the answer
        self.thoughts.hide()
        self.body = MessageBody(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addLayout(header)
        layout.addWidget(self.left_out_label)
        layout.addWidget(self.thoughts_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.thoughts)
        layout.addWidget(self.body)
        self.update_from(message, answering=False)

    @property
    def message_id(self) -> int:
        return self.message.id

    def text(self) -> str:
        return self.body.source_text

    def set_text(self, text: str) -> None:
        self.body.set_source(text)

    def set_thoughts(self, text: str, thinking: bool) -> None:
        """A reasoning model's thoughts, folded; ``thinking``: the answer has not begun."""
        self.thoughts_button.setVisible(bool(text))
        self.thoughts_button.setText("Thinking…" if thinking else "Thoughts")
        if text != self.thoughts.source_text:
            self.thoughts.set_source(text)

    def _show_thoughts(self, shown: bool) -> None:
        self.thoughts_button.setArrowType(Qt.ArrowType.DownArrow if shown
                                          else Qt.ArrowType.RightArrow)
        self.thoughts.setVisible(shown)

    def update_from(self, message: Message, answering: bool) -> None:
        self.message = message
        self.set_thoughts(message.thoughts, answering and not message.content)
        self.body.set_source(message.content)
        self.info.setText(describe(message, answering))
        failed = message.state == "failed" and bool(message.note)
        self.info.setEnabled(failed)  # a failure is read in full colour, the rest quieter
        self.info.setStyleSheet("color: #b3261e; font-weight: bold;" if failed else "")

    def set_left_out(self, left_out: bool) -> None:
        """Mark the message as kept but not sent to the model (greyed, with a line)."""
        self.left_out = left_out
        self.left_out_label.setVisible(left_out)
        self.body.setEnabled(not left_out)
