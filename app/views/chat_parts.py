"""Small parts of the chat view: the input box, the context banner, the sampling panel,
and saving an export off the GUI thread."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Qt, QThreadPool, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.settings import CHAT_SAMPLING
from app.store import ChatStore, Conversation

W = TypeVar("W", bound=QWidget)


def named(widget: W, name: str) -> W:
    """``widget`` with its objectName set (tests and screenshots find widgets by name)."""
    widget.setObjectName(name)
    return widget


EXPORT_KINDS = {"markdown": ".md", "md": ".md", "json": ".json"}


def export_text(store: ChatStore, conv: Conversation | None, kind: str
                ) -> tuple[str, str] | str:
    """(the file's text, a file name to suggest), or a sentence saying why not."""
    suffix = EXPORT_KINDS.get(kind.lower())
    if suffix is None:
        return f"Cannot export as {kind!r}: choose Markdown or JSON."
    if conv is None:
        return "There is no chat to export yet."
    if suffix == ".md":
        text = store.export_markdown(conv.id)
    else:
        text = json.dumps(store.export_json(conv.id), indent=2, ensure_ascii=False)
    slug = re.sub(r"[^\w-]+", "-", conv.title).strip("-")[:60] or "chat"
    return text, slug + suffix


def ask_save_path(parent: QWidget | None, suggested: Path) -> Path | None:
    """Where to save an export (tests replace this: no modal dialog may block them)."""
    filters = "Markdown (*.md)" if suggested.suffix == ".md" else "JSON (*.json)"
    name, _selected = QFileDialog.getSaveFileName(parent, "Export chat", str(suggested),
                                                  filters)
    return Path(name) if name else None


class ChatInput(QPlainTextEdit):
    """The message box: Enter sends, Shift+Enter is a new line, Esc stops."""

    submitted = Signal()
    escaped = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatInput")
        self.setPlaceholderText("Message the model — Enter sends, Shift+Enter for a new line")
        self.setTabChangesFocus(True)
        self.setMaximumHeight(self.fontMetrics().lineSpacing() * 4 + 16)  # ~4 lines

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.insertPlainText("\n")
            return
        if enter:
            self.submitted.emit()
            return
        if event.key() == Qt.Key.Key_Escape:
            self.escaped.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    """The message box with Send, Stop and Regenerate, and the "editing" hint above it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.editing_label = named(QLabel("Editing your message: Send replaces it and drops "
                                          "the messages after it. Esc cancels."), "chatEditing")
        self.editing_label.setWordWrap(True)
        self.editing_label.hide()
        self.input = ChatInput(self)
        self.send_button = named(QPushButton("Send"), "chatSend")
        self.stop_button = named(QPushButton("Stop"), "chatStop")
        self.regen_button = named(QPushButton("Regenerate"), "chatRegenerate")
        buttons = QVBoxLayout()
        for button in (self.send_button, self.stop_button, self.regen_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.editing_label)
        column.addLayout(row)

    def begin_edit(self, text: str) -> None:
        self.input.setPlainText(text)
        self.editing_label.show()
        self.input.setFocus()

    def end_edit(self) -> None:
        self.editing_label.hide()


class InlineNotice(QLabel):
    """A sentence above the transcript (saved, worker stopped, ...); hidden when empty."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)
        self.setObjectName("chatNotice")
        self.setWordWrap(True)
        self.hide()

    def say(self, text: str) -> None:
        self.setText(text)
        self.setVisible(bool(text))


class ContextBanner(QFrame):
    """Says the conversation no longer fits the model's context, and offers what to do."""

    new_chat = Signal()
    drop_oldest = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.text = named(QLabel(""), "contextBannerText")
        self.text.setWordWrap(True)
        self.new_button = named(QPushButton("Start a new chat"), "bannerNewChat")
        self.drop_button = named(QPushButton("Leave older messages out"), "bannerDropOldest")
        close = named(QPushButton("Dismiss"), "bannerDismiss")
        close.setFlat(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addWidget(self.drop_button)
        buttons.addStretch(1)
        buttons.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addLayout(buttons)
        self.new_button.clicked.connect(self.new_chat.emit)
        self.drop_button.clicked.connect(self.drop_oldest.emit)
        close.clicked.connect(self.hide)
        self.hide()

    def show_overflow(self, history: int | None, context: int | None, can_drop: bool) -> None:
        size = f"{history} tokens" if history is not None else "more than the context holds"
        limit = f"{context} tokens" if context is not None else "smaller"
        lines = [f"This conversation no longer fits the model's context: the history is "
                 f"{size}, the model's context is {limit}. Nothing was sent and nothing was "
                 "cut."]
        if can_drop:
            lines.append("Start a new chat, or leave the oldest messages of this one out of "
                         "what the model is sent and send again: they stay in this chat and "
                         "its exports.")
        else:
            lines.append("Your last message alone leaves no room for an answer: edit it to "
                         "shorten it, or start a new chat with a shorter one.")
        self.text.setText(" ".join(lines))
        self.drop_button.setVisible(can_drop)
        self.show()


class SamplingPanel(QWidget):
    """The conversation's system prompt and sampling settings; ``changed`` on any edit."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatSettings")
        self.system_prompt = named(QPlainTextEdit(), "systemPrompt")
        self.system_prompt.setPlaceholderText("System prompt (empty: none)")
        self.system_prompt.setMaximumHeight(70)
        self.temperature = named(QDoubleSpinBox(), "temperature")
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.top_p = named(QDoubleSpinBox(), "topP")
        self.top_p.setRange(0.0, 1.0)
        self.top_p.setSingleStep(0.05)
        self.max_tokens = named(QSpinBox(), "maxTokens")
        self.max_tokens.setRange(1, 131072)
        # 1.0 = off; a little above it keeps a small model out of loops ("I'm best at it
        # too. I'm best at it too.")
        self.repetition_penalty = named(QDoubleSpinBox(), "repetitionPenalty")
        self.repetition_penalty.setRange(1.0, 2.0)
        self.repetition_penalty.setSingleStep(0.05)
        self.repetition_penalty.setToolTip("Above 1.0, tokens already in the conversation "
                                           "become less likely: fewer repeated sentences")
        # a reasoning model whose template takes enable_thinking (Qwen3): think first or not
        self.think = named(QCheckBox("Think"), "thinkSwitch")
        self.think.setChecked(True)
        self.think.setToolTip("The model writes its reasoning first (shown folded above "
                              "the answer); off: it answers at once")
        self.think.hide()
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("System prompt", self.system_prompt)
        row = QHBoxLayout()
        for label, box in (("Temperature", self.temperature), ("Top p", self.top_p),
                           ("Repetition penalty", self.repetition_penalty),
                           ("Max tokens", self.max_tokens)):
            row.addWidget(QLabel(label))
            row.addWidget(box)
        row.addWidget(self.think)
        row.addStretch(1)
        form.addRow(row)
        self._loading = False
        self.system_prompt.textChanged.connect(self._emit)
        self.temperature.valueChanged.connect(self._emit)
        self.top_p.valueChanged.connect(self._emit)
        self.max_tokens.valueChanged.connect(self._emit)
        self.repetition_penalty.valueChanged.connect(self._emit)
        self.think.toggled.connect(self._emit)

    def set_model(self, card: dict[str, Any] | None) -> None:
        """The Think switch shows for a model whose template takes ``enable_thinking``
        (the worker's ``meta.reasoning``)."""
        reasoning = ((card or {}).get("meta") or {}).get("reasoning") or {}
        self.think.setVisible(bool(reasoning.get("switch")))

    def load(self, system_prompt: str, sampling: dict[str, Any]) -> None:
        self._loading = True
        try:
            self.system_prompt.setPlainText(system_prompt)
            defaults = CHAT_SAMPLING
            self.temperature.setValue(float(sampling.get("temperature",
                                                         defaults["temperature"])))
            self.top_p.setValue(float(sampling.get("top_p", defaults["top_p"])))
            self.repetition_penalty.setValue(float(sampling.get(
                "repetition_penalty", defaults["repetition_penalty"])))
            self.max_tokens.setValue(int(sampling.get("max_tokens", defaults["max_tokens"])))
            kwargs = sampling.get("chat_template_kwargs") or {}
            self.think.setChecked(bool(kwargs.get("enable_thinking", True)))
        finally:
            self._loading = False

    def sampling(self) -> dict[str, Any]:
        """The request's sampling fields (the Think switch as the template's variable)."""
        fields: dict[str, Any] = {"temperature": round(self.temperature.value(), 3),
                                  "top_p": round(self.top_p.value(), 3),
                                  "repetition_penalty": round(self.repetition_penalty.value(),
                                                              3),
                                  "max_tokens": self.max_tokens.value()}
        if not self.think.isHidden():
            fields["chat_template_kwargs"] = {"enable_thinking": self.think.isChecked()}
        return fields

    def _emit(self, *_args: object) -> None:
        if not self._loading:
            self.changed.emit()


class _Signals(QObject):
    done = Signal(object)  # Path
    failed = Signal(str)


def write_in_background(path: Path, text: str, parent: QObject,
                        on_done: Callable[[Path], None], on_failed: Callable[[str], None]
                        ) -> None:
    """Write ``text`` to ``path`` on the thread pool; then ``on_done(path)`` or
    ``on_failed(sentence)`` on the GUI thread."""
    signals = _Signals(parent)
    signals.done.connect(on_done)
    signals.failed.connect(on_failed)
    signals.done.connect(signals.deleteLater)
    signals.failed.connect(signals.deleteLater)

    def write() -> None:
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            signals.failed.emit(f"Could not save {path}: {exc.strerror or exc}")
            return
        signals.done.emit(path)

    QThreadPool.globalInstance().start(write)
