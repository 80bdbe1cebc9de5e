"""One memory gauge: a custom-painted bar as wide as the memory (this app's weights, KV and
runtime from the left, other programs from the right, free memory between), a mark at the
limit and the headroom hatched up to it, with the exact figures under it and in its
tooltip.

Colours come from the palette (the highlight colour at several strengths, ``mid`` for
other programs), so the bar follows the light or dark theme.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def label(text: str, name: str) -> QLabel:
    """A QLabel with an objectName (tests and screenshots find it by name)."""
    widget = QLabel(text)
    widget.setObjectName(name)
    return widget


def plural(n: int, word: str) -> str:
    """``1 model``, ``2 models``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def human(n: int | float | None) -> str:
    """``212 MiB``, ``1.25 GiB``, ``512 KiB``, ``0 B``; "unknown" for None."""
    if n is None:
        return "unknown"
    sign, n = ("-", -n) if n < 0 else ("", n)
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            x = n / size
            digits = 2 if x < 10 else 1 if x < 100 else 0
            return f"{sign}{x:.{digits}f} {unit}"
    return f"{sign}{int(n)} B"


@dataclass(frozen=True)
class Segment:
    """A part of the bar: ``role`` picks the colour (weights, kv, app, others, device,
    host, disk)."""

    label: str
    nbytes: int
    role: str


def role_colour(palette: QPalette, role: str) -> QColor:
    """The palette colour of a segment role."""
    hi = palette.color(QPalette.ColorRole.Highlight)
    colour = QColor(hi)
    if role in ("weights", "device"):
        return colour
    if role in ("kv", "host"):
        colour.setAlpha(165)
        return colour
    if role == "app":
        colour.setAlpha(90)
        return colour
    if role == "disk":
        return palette.color(QPalette.ColorRole.Dark)
    return palette.color(QPalette.ColorRole.Mid)  # others


def solid(colour: QColor, background: QColor) -> QColor:
    """``colour`` drawn over ``background``, opaque (for text swatches, which drop alpha)."""
    a = colour.alphaF()
    mix = [a * c + (1 - a) * b for c, b in
           ((colour.redF(), background.redF()), (colour.greenF(), background.greenF()),
            (colour.blueF(), background.blueF()))]
    return QColor.fromRgbF(mix[0], mix[1], mix[2])


class MemoryBar(QWidget):
    """The painted bar; ``set_figures`` or ``set_message`` ("no GPU")."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.segments: tuple[Segment, ...] = ()
        self.scale = 0
        self.limit: int | None = None
        self.headroom: int | None = None
        self.message = ""
        self.setMinimumHeight(18)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(220, 18)

    def set_figures(self, segments: list[Segment], scale: int, limit: int | None,
                    headroom: int | None) -> None:
        self.segments = tuple(s for s in segments if s.nbytes > 0)
        self.scale = max(scale, sum(s.nbytes for s in self.segments), limit or 0, 1)
        self.limit, self.headroom, self.message = limit, headroom, ""
        self.update()

    def set_message(self, text: str) -> None:
        self.segments, self.message = (), text
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        frame = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        painter.setPen(QPen(pal.color(QPalette.ColorRole.Mid), 1))
        painter.setBrush(pal.color(QPalette.ColorRole.Base))
        painter.drawRoundedRect(frame, 3, 3)
        if self.message:
            painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(frame, Qt.AlignmentFlag.AlignCenter, self.message)
            return
        inner = frame.adjusted(1, 1, -1, -1)
        per_byte = inner.width() / max(self.scale, 1)
        x = inner.left()
        painter.setPen(Qt.PenStyle.NoPen)
        for seg in self.segments:  # this app from the left
            if seg.role == "others":
                continue
            width = seg.nbytes * per_byte
            painter.setBrush(role_colour(pal, seg.role))
            painter.drawRect(QRectF(x, inner.top(), width, inner.height()))
            x += width
        right = inner.right()
        for seg in self.segments:  # other programs from the right: free memory between
            if seg.role == "others":
                width = seg.nbytes * per_byte
                right -= width
                painter.setBrush(role_colour(pal, seg.role))
                painter.drawRect(QRectF(right, inner.top(), width, inner.height()))
        if self.headroom and self.headroom > 0:
            shade = QColor(pal.color(QPalette.ColorRole.Highlight))
            shade.setAlpha(110)
            painter.setBrush(QBrush(shade, Qt.BrushStyle.BDiagPattern))
            width = min(self.headroom * per_byte, inner.right() - x)
            painter.drawRect(QRectF(x, inner.top(), max(0.0, width), inner.height()))
        if self.limit is not None:
            lx = inner.left() + min(self.limit * per_byte, inner.width())
            painter.setPen(QPen(pal.color(QPalette.ColorRole.Text), 2))
            painter.drawLine(int(lx), int(frame.top()), int(lx), int(frame.bottom()))


class Gauge(QWidget):
    """Title, the bar, a line of figures and a legend; ``show_figures`` fills it."""

    def __init__(self, title: str, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(f"gauge_{name}")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        self.title = label(f"<b>{html.escape(title)}</b>", f"gauge_{name}_title")
        self.bar = MemoryBar(self)
        self.bar.setObjectName(f"gauge_{name}_bar")
        self.figures = label("waiting for the worker…", f"gauge_{name}_figures")
        self.figures.setWordWrap(True)
        self.legend = label("", f"gauge_{name}_legend")
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        for widget in (self.title, self.bar, self.figures, self.legend):
            layout.addWidget(widget)

    def show_figures(self, segments: list[Segment], scale: int, limit: int | None,
                     headroom: int | None, figures: str, details: list[str]) -> None:
        """The bar, ``figures`` under it, a legend of the segments; ``details`` (exact
        numbers) in the tooltip."""
        self.bar.set_figures(segments, scale, limit, headroom)
        self.figures.setText(figures)
        pal = self.palette()
        base = pal.color(QPalette.ColorRole.Base)
        # non-breaking inside an item: a narrow panel wraps between items, never between
        # a swatch and its label
        items = [f'<span style="color:{solid(role_colour(pal, s.role), base).name()}">'
                 f"&#9632;</span>&nbsp;"
                 + html.escape(f"{s.label} {human(s.nbytes)}").replace(" ", "&nbsp;")
                 for s in segments if s.nbytes > 0]
        self.legend.setText(" &nbsp; ".join(items))
        self.legend.setVisible(bool(items))
        exact = [f"{s.label}: {human(s.nbytes)} ({s.nbytes:,} bytes)" for s in segments]
        self.setToolTip("\n".join([*exact, *details]))

    def show_message(self, message: str, figures: str) -> None:
        self.bar.set_message(message)
        self.figures.setText(figures)
        self.legend.setText("")
        self.legend.setVisible(False)
        self.setToolTip(figures)
