"""A one-line label that never widens its window: text longer than the room it has is
cut with "…" and shown whole in its tooltip."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QStyle, QStyleOption, QWidget

#: The least width an elided label asks of its layout (pixels): "Abc…" in most fonts.
MIN_WIDTH = 48


class ElidedLabel(QLabel):
    """``QLabel`` for one line of plain text: its minimum width is small, whatever the
    text; what does not fit ends in "…"; the tooltip holds the whole text."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text)

    def minimumSizeHint(self) -> QSize:
        return QSize(min(MIN_WIDTH, super().minimumSizeHint().width()),
                     super().minimumSizeHint().height())

    def elided(self) -> bool:
        """Whether the text is cut where it is shown now."""
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        option = QStyleOption()
        option.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_Widget, option, painter, self)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight,
                                             rect.width())
        self.style().drawItemText(painter, rect, int(self.alignment()), self.palette(),
                                  self.isEnabled(), text, self.foregroundRole())
