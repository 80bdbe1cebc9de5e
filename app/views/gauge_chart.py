"""A small live chart of the last minutes: memory (RAM, VRAM when there is a GPU, KV) on the
left axis and the last answer's tokens/s on the right axis (QtCharts, from pyside6-addons).

The x axis is seconds before now (``-180 … 0``; shorter, in 30 s steps, while less history
exists); the chart is redrawn from the feed's history on each snapshot, which is cheap at
one point a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QValueAxis
from PySide6.QtCore import QMargins, QPointF, Qt
from PySide6.QtGui import QPainter, QPalette, QPen
from PySide6.QtWidgets import QWidget

from app.resources_feed import Sample
from app.views.gauge_bar import GIB, MIB


class LiveChart(QChartView):
    """Memory and tokens/s over the feed's window; ``show_history`` redraws it."""

    def __init__(self, window_s: float = 180.0, parent: QWidget | None = None) -> None:
        chart = QChart()
        super().__init__(chart, parent)
        self.setObjectName("resourcesChart")
        self.window_s = window_s
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setMinimumHeight(170)
        chart.setMargins(QMargins(2, 2, 2, 2))
        chart.layout().setContentsMargins(0, 0, 0, 0)
        chart.setBackgroundVisible(False)
        chart.legend().setAlignment(Qt.AlignmentFlag.AlignBottom)
        self.ram = self._series("RAM")
        self.vram = self._series("VRAM")
        self.kv = self._series("KV")
        self.tps = self._series("tokens/s")
        self.x_axis = self._axis("seconds ago", -window_s, 0, Qt.AlignmentFlag.AlignBottom)
        self.mem_axis = self._axis("MiB", 0, 1, Qt.AlignmentFlag.AlignLeft)
        self.tps_axis = self._axis("tok/s", 0, 1, Qt.AlignmentFlag.AlignRight)
        for series in (self.ram, self.vram, self.kv):
            series.attachAxis(self.x_axis)
            series.attachAxis(self.mem_axis)
        self.tps.attachAxis(self.x_axis)
        self.tps.attachAxis(self.tps_axis)
        self.tps.setPen(QPen(self.palette().color(QPalette.ColorRole.Text), 1.5,
                             Qt.PenStyle.DashLine))
        self.vram.setVisible(False)
        self._apply_palette()

    def _series(self, name: str) -> QLineSeries:
        series = QLineSeries()
        series.setName(name)
        self.chart().addSeries(series)
        return series

    def _axis(self, title: str, low: float, high: float, where: Qt.AlignmentFlag
              ) -> QValueAxis:
        axis = QValueAxis()
        axis.setTitleText(title)
        axis.setRange(low, high)
        axis.setLabelFormat("%.0f")
        axis.setTickCount(4)
        self.chart().addAxis(axis, where)
        return axis

    def _apply_palette(self) -> None:
        pal = self.palette()
        text = pal.color(QPalette.ColorRole.Text)
        self.chart().legend().setLabelColor(text)
        for axis in (self.x_axis, self.mem_axis, self.tps_axis):
            axis.setLabelsColor(text)
            axis.setTitleBrush(text)
            axis.setGridLineColor(pal.color(QPalette.ColorRole.Midlight))

    def show_history(self, history: Sequence[Sample], now: float) -> None:
        """Redraw from the feed's samples (``now``: the same clock as ``Sample.t``)."""
        fresh = [s for s in history if now - s.t <= self.window_s]
        # the x axis grows in 30 s steps up to the window, so a fresh start is not a few
        # points squeezed against the right edge of three empty minutes
        span = max((now - s.t for s in fresh), default=0.0)
        self.x_axis.setRange(-min(self.window_s, 30.0 * max(1, math.ceil(span / 30.0))), 0)
        biggest = max((v for s in fresh for v in (s.ram_used, s.vram_used, s.kv_bytes)
                       if v is not None), default=0)
        unit, name = (GIB, "GiB") if biggest >= 2 * GIB else (MIB, "MiB")
        self.mem_axis.setTitleText(name)

        def line(series: QLineSeries, value: Callable[[Sample], float | int | None],
                 scale: float = 1.0) -> float:
            pts = [QPointF(s.t - now, v / scale) for s in fresh
                   if (v := value(s)) is not None]
            series.replace(pts)
            return max((p.y() for p in pts), default=0.0)

        top = max(line(self.ram, lambda s: s.ram_used, unit),
                  line(self.vram, lambda s: s.vram_used, unit),
                  line(self.kv, lambda s: s.kv_bytes, unit))
        self.vram.setVisible(self.vram.count() > 0)
        self.mem_axis.setLabelFormat("%.1f" if top < 10 else "%.0f")
        self.mem_axis.setRange(0, max(top * 1.15, 1.0 if unit == GIB else 16.0))
        tps_top = line(self.tps, lambda s: s.tokens_per_s)
        self.tps_axis.setRange(0, max(tps_top * 1.15, 10.0))
