"""The transcript: one widget per message in a scroll area that follows a growing answer
(unless the user scrolled up to read)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QScrollArea, QVBoxLayout, QWidget

from app.store import Message
from app.views.chat_message import MessageWidget
from app.views.chat_parts import named

STICK_PX = 24  # this close to the bottom counts as "at the bottom"


class Transcript(QScrollArea):
    edit_requested = Signal(int)  # message id

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatTranscript")
        self.setWidgetResizable(True)
        self.inner = named(QWidget(), "chatMessages")
        self._layout = QVBoxLayout(self.inner)
        self._layout.addStretch(1)
        self.setWidget(self.inner)
        self._widgets: dict[int, MessageWidget] = {}
        self._stick = True
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range)
        bar.valueChanged.connect(self._on_scrolled)

    def widgets(self) -> list[MessageWidget]:
        return sorted(self._widgets.values(), key=lambda w: w.message.position)

    def widget_of(self, message_id: int) -> MessageWidget | None:
        return self._widgets.get(message_id)

    def __len__(self) -> int:
        return len(self._widgets)

    def add(self, message: Message, answering: bool) -> MessageWidget:
        widget = MessageWidget(message, self.inner)
        widget.update_from(message, answering)
        widget.edit_requested.connect(self.edit_requested)
        self._layout.insertWidget(self._layout.count() - 1, widget)
        self._widgets[message.id] = widget
        return widget

    def remove(self, message_ids: list[int]) -> None:
        for message_id in message_ids:
            widget = self._widgets.pop(message_id, None)
            if widget is not None:
                widget.setParent(None)
                widget.deleteLater()

    def clear(self) -> None:
        self.remove(list(self._widgets))
        self._stick = True

    def _on_range(self, _low: int, high: int) -> None:
        if self._stick:  # following the answer as it grows
            self.verticalScrollBar().setValue(high)

    def _on_scrolled(self, value: int) -> None:
        self._stick = value >= self.verticalScrollBar().maximum() - STICK_PX
