"""The main window: a rail of views in the centre, the resources panel on the right, a
banner for what went wrong (and what to do), and a status bar with the model, where it
runs, the last answer's speed and the worker's state.

Views are built on first show (the window appears at once; the chart library and the
model library scan load only when asked for), except the chat, which is the first view.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QDockWidget,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.views import named
from app.views.elided import ElidedLabel
from app.worker import Crash, ReadyInfo

#: (key, label, icon, factory module path, class name)
VIEWS: tuple[tuple[str, str, QStyle.StandardPixmap, str, str], ...] = (
    ("chat", "Chat", QStyle.StandardPixmap.SP_FileDialogDetailedView, "app.views.chat_view",
     "ChatView"),
    ("code", "Code", QStyle.StandardPixmap.SP_FileIcon, "app.views.code_view", "CodeView"),
    ("models", "Models", QStyle.StandardPixmap.SP_DriveHDIcon, "app.views.models_view",
     "ModelsView"),
    ("editors", "Editors", QStyle.StandardPixmap.SP_ComputerIcon, "app.views.editors_view",
     "EditorSetupView"),
    ("settings", "Settings", QStyle.StandardPixmap.SP_FileDialogContentsView,
     "app.views.settings_view", "SettingsView"),
)


class Banner(QWidget):
    """One line of news across the top: info, warning or error, with details on demand.
    It lies over the top of the page (the page does not move) and is as wide as the
    page: its text wraps, it never widens the window. News (info) goes by itself after
    ``INFO_MS``; a warning or an error stays until dismissed."""

    INFO_MS = 10_000

    def __init__(self, parent: QWidget | None = None, over: QWidget | None = None) -> None:
        super().__init__(parent)
        self.over = over  # the widget it lies over (default: all of its parent)
        self.setObjectName("banner")
        column = QVBoxLayout(self)
        column.setContentsMargins(8, 4, 8, 4)
        layout = QHBoxLayout()
        column.addLayout(layout)
        self.text = named(QLabel(), "bannerText")
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_button = named(QPushButton("Details"), "bannerDetails")
        self.details_button.setCheckable(True)
        self.close_button = named(QPushButton("Dismiss"), "bannerDismiss")
        layout.addWidget(self.text, 1)
        layout.addWidget(self.details_button)
        layout.addWidget(self.close_button)
        self.details = named(QLabel(), "bannerDetailsText")
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setVisible(False)
        self.details.setWordWrap(True)
        column.addWidget(self.details)
        self.details_button.toggled.connect(self._toggle_details)
        self.close_button.clicked.connect(self.hide)
        self.level = ""
        self._expire = QTimer(self)
        self._expire.setSingleShot(True)
        self._expire.timeout.connect(self.hide)
        self.setAutoFillBackground(True)
        self.hide()
        for watched in (parent, over):
            if watched is not None:
                watched.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() in (QEvent.Type.Resize, QEvent.Type.Move) and \
                watched in (self.parentWidget(), self.over):
            self.place()
        return False

    def place(self) -> None:
        """Across the top of the page, as tall as its text needs (at most half the page)."""
        page = self.parentWidget()
        if page is None:
            return
        area = self.over.geometry() if self.over is not None else page.rect()
        width, layout = area.width(), self.layout()
        height = layout.totalHeightForWidth(width) if layout is not None and \
            layout.hasHeightForWidth() else self.sizeHint().height()
        self.setGeometry(area.x(), area.y(), width,
                         min(max(height, self.sizeHint().height()), max(area.height() // 2, 1)))
        self.raise_()

    def _toggle_details(self, shown: bool) -> None:
        self.details.setVisible(shown)
        self.place()

    def show_message(self, level: str, text: str, details: str = "") -> None:
        self.level = level
        marks = {"error": "⚠", "warning": "⚠", "info": "ℹ"}
        self.text.setText(f"{marks.get(level, '')} {text}".strip())
        self.details.setText(details)
        self.details_button.setVisible(bool(details))
        self.details_button.setChecked(False)
        self.setProperty("level", level)
        # a role, not a colour: the banner follows a change of theme while it shows
        self.setBackgroundRole(QPalette.ColorRole.AlternateBase if level == "info" else
                               QPalette.ColorRole.ToolTipBase)
        self.show()
        self.place()
        if level == "info":
            self._expire.start(self.INFO_MS)
        else:
            self._expire.stop()


class MainWindow(QMainWindow):
    view_created = Signal(str)
    closed = Signal()  # the window closed (the worker stops behind it)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.setWindowTitle("ONNX Local LLM")
        self.setObjectName("mainWindow")
        self.resize(1200, 780)
        self.views: dict[str, QWidget] = {}
        self._pages: dict[str, QScrollArea] = {}  # each view in its scroll area
        self._build_centre()
        self._build_status_bar()
        self._build_menus()
        self.gauges_dock = named(QDockWidget("Resources", self), "resourcesDock")
        self.gauges_dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.gauges_dock.setMinimumWidth(300)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.gauges_dock)
        self.toggle_gauges.toggled.connect(self.gauges_dock.setVisible)
        self.gauges_dock.visibilityChanged.connect(self._on_panel_visibility)
        self._closing = False
        ctx.notice.connect(self.banner.show_message)
        ctx.ready.connect(self._on_ready)
        ctx.down.connect(self._on_down)
        ctx.model_changed.connect(self._on_model)
        ctx.busy.connect(self._on_busy)
        self._restore_state()
        QTimer.singleShot(0, self._build_gauges)  # after the first paint

    # --- layout ---------------------------------------------------------------------------

    def _build_centre(self) -> None:
        centre = named(QWidget(), "centre")
        outer = QVBoxLayout(centre)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        row = QHBoxLayout()
        row.setSpacing(0)
        self.rail = named(QListWidget(), "rail")
        self.rail.setIconSize(QSize(22, 22))
        self.rail.setFixedWidth(96)
        self.rail.setViewMode(QListWidget.ViewMode.IconMode)
        self.rail.setMovement(QListWidget.Movement.Static)
        self.rail.setFlow(QListWidget.Flow.TopToBottom)
        self.rail.setSpacing(4)
        self.rail.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.rail.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.stack = named(QStackedWidget(), "views")
        for key, label, icon, _, _ in VIEWS:
            item = QListWidgetItem(self.style().standardIcon(icon), label)
            item.setData(Qt.ItemDataRole.UserRole, key)
            item.setSizeHint(QSize(88, 56))
            item.setTextAlignment(Qt.AlignmentFlag.AlignHCenter)
            self.rail.addItem(item)
        self.rail.currentItemChanged.connect(
            lambda item, _old: item and self.show_view(item.data(Qt.ItemDataRole.UserRole)))
        row.addWidget(self.rail)
        row.addWidget(self.stack, 1)
        outer.addLayout(row, 1)
        self.setCentralWidget(centre)
        self.banner = Banner(centre, over=self.stack)  # over the page, in no layout

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.model_label = named(ElidedLabel("No model"), "statusModel")
        self.device_label = named(ElidedLabel(""), "statusDevice")
        self.speed_label = named(ElidedLabel(""), "statusSpeed")
        self.state_label = named(ElidedLabel("Worker: starting"), "statusWorker")
        self.progress = named(QProgressBar(), "statusBusy")
        self.progress.setRange(0, 0)  # indeterminate
        self.progress.setMaximumWidth(120)
        self.progress.setTextVisible(False)
        for widget in (self.model_label, self.device_label, self.speed_label):
            bar.addWidget(widget)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.state_label)

    def _build_menus(self) -> None:
        menu = self.menuBar()
        file_menu = menu.addMenu("&File")
        self._action(file_menu, "New chat", "Ctrl+N", lambda: self._call("chat",
                                                                        "new_conversation"))
        self._action(file_menu, "Export chat as Markdown…", None,
                     lambda: self._call("chat", "export", "markdown"))
        self._action(file_menu, "Export chat as JSON…", None,
                     lambda: self._call("chat", "export", "json"))
        file_menu.addSeparator()
        self._action(file_menu, "Quit", QKeySequence.StandardKey.Quit, self.close)
        view_menu = menu.addMenu("&View")
        for key, label, *_ in VIEWS:
            self._action(view_menu, label, None, functools.partial(self.show_view, key))
        view_menu.addSeparator()
        self.toggle_gauges = self._action(view_menu, "Resources panel", "Ctrl+R", None)
        self.toggle_gauges.setCheckable(True)
        self.toggle_gauges.setChecked(True)
        help_menu = menu.addMenu("&Help")
        self._action(help_menu, "Welcome", None, self.show_welcome)
        self._action(help_menu, "About ONNX Local LLM", None, self.show_about)
        self._action(self, "Focus input", "Ctrl+L", lambda: self._call("chat", "focus_input"))

    def _action(self, owner: Any, text: str, shortcut: Any, slot: Callable[[], Any] | None
                ) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if slot is not None:
            action.triggered.connect(lambda _checked=False: slot())
        owner.addAction(action)
        return action

    # --- views ----------------------------------------------------------------------------

    def view(self, key: str) -> QWidget:
        """The view ``key`` (built on first use)."""
        if key not in self.views:
            spec = next(v for v in VIEWS if v[0] == key)
            widget = self._make(spec[3], spec[4])
            widget.setObjectName(f"view_{key}")
            self.views[key] = widget
            # a view wider or taller than the window scrolls: it never widens the window
            page = named(QScrollArea(), f"page_{key}")
            page.setWidgetResizable(True)
            page.setFrameShape(QFrame.Shape.NoFrame)
            page.setWidget(widget)
            self._pages[key] = page
            self.stack.addWidget(page)
            widget.resize(self.stack.size())  # its size now, for the splitter's sizes
            if (layout := widget.layout()) is not None:
                layout.activate()
            self._restore_splitter(key, widget)
            self.view_created.emit(key)
        return self.views[key]

    def _make(self, module: str, name: str) -> QWidget:
        import importlib

        try:
            cls = getattr(importlib.import_module(module), name)
            widget: QWidget = cls(self.ctx)
            return widget
        except Exception as exc:  # a broken view must not take the window down
            label = QLabel(f"This view could not be opened: {exc}")
            label.setWordWrap(True)
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            self.ctx.notice.emit("error", f"{name} failed to open: {exc}")
            return label

    def show_view(self, key: str) -> QWidget:
        widget = self.view(key)
        self.stack.setCurrentWidget(self._pages[key])
        for row in range(self.rail.count()):
            item = self.rail.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == key and self.rail.currentRow() != row:
                self.rail.setCurrentRow(row)
        return widget

    def current_view(self) -> QWidget | None:
        """The view shown now."""
        page = self.stack.currentWidget()
        return page.widget() if isinstance(page, QScrollArea) else None

    def _call(self, key: str, method: str, *args: Any) -> None:
        target = getattr(self.show_view(key), method, None)
        if callable(target):
            target(*args)

    def _build_gauges(self) -> None:
        if self.gauges_dock.widget() is None:
            panel = self._make("app.views.gauges", "GaugesPanel")
            self.gauges_dock.setWidget(panel)
            feed = getattr(panel, "feed", None)
            if feed is not None:
                feed.snapshot.connect(self._on_snapshot)

    def _on_snapshot(self, snapshot: dict[str, Any]) -> None:
        last = ((snapshot.get("throughput") or {}).get("last") or {})
        if last.get("tokens_per_s"):
            self.show_speed(float(last["tokens_per_s"]), last.get("ttft_ms"))

    def show_welcome(self) -> None:
        from app.views.welcome import WelcomeDialog

        dialog = WelcomeDialog(self.ctx, self)
        dialog.get_requested.connect(self.get_from_catalog)
        dialog.open()

    def get_from_catalog(self, entry: Any) -> None:
        """The Models page's Catalog tab, getting ``entry`` (a welcome suggestion)."""
        view: Any = self.show_view("models")
        catalog = getattr(view, "catalog", None)
        if catalog is not None:
            view.tabs.setCurrentWidget(catalog)
            catalog.get_entry(entry)

    def show_about(self) -> QWidget:
        from app.views.about import AboutDialog

        dialog = AboutDialog(self)
        dialog.open()
        return dialog

    # --- worker state ---------------------------------------------------------------------

    def set_worker_state(self, state: str) -> None:
        words = {"starting": "starting…", "ready": "ready", "restarting": "restarting…",
                 "stopping": "stopping…", "stopped": "stopped", "failed": "failed",
                 "remote": "remote server"}
        self.state_label.setText(f"Worker: {words.get(state, state)}")
        self.progress.setVisible(state in ("starting", "restarting"))

    def attach_worker(self) -> None:
        worker = self.ctx.worker
        if worker is None:
            return
        worker.state_changed.connect(self.set_worker_state)
        worker.died.connect(self._on_crash)
        self.set_worker_state(worker.state)

    def _on_ready(self) -> None:
        if self.banner.level == "error" and self.banner.isVisible():
            self.banner.show_message("info", "The worker is running again. Your chats are "
                                     "kept; send the next message when you like.")
        if self.ctx.remote:
            self.set_worker_state("remote")

    def _on_down(self, reason: str) -> None:
        self.model_label.setText("No model")

    def _on_crash(self, crash: Crash) -> None:
        then = "Restarting it…" if crash.restarting else (
            "It keeps failing, so it was not restarted: fix the cause, then use Settings → "
            "Restart worker.")
        self.banner.show_message("error", f"{crash.diagnosis} {then}",
                                 "\n".join(crash.stderr_tail[-12:]))

    def _on_model(self, card: dict[str, Any] | None) -> None:
        if card is None:
            self.model_label.setText("No model")
            self.device_label.setText("")
            return
        meta = card.get("meta") or {}
        self.model_label.setText(f"Model: {card.get('id')}")
        if self.ctx.remote:
            self.device_label.setText("Runs on: the remote server")
            self.speed_label.setText("")
        else:
            self.device_label.setText(f"Runs on: {device_words(meta.get('provider'))}")

    def _on_busy(self, label: str) -> None:
        self.progress.setVisible(bool(label))
        if label:
            self.statusBar().showMessage(label)
        else:
            self.statusBar().clearMessage()

    def show_speed(self, tokens_per_s: float, ttft_ms: float | None = None) -> None:
        first = f", first token {ttft_ms:.0f} ms" if ttft_ms else ""
        self.speed_label.setText(f"Last answer: {tokens_per_s:.1f} tok/s{first}")

    def on_worker_ready(self, info: ReadyInfo) -> None:
        self.statusBar().showMessage(f"Worker ready in {info.started_s:.1f} s", 4000)

    def _restore_state(self) -> None:
        """Window size and place, the resources panel and the last view, as left."""
        s = self.ctx.settings
        geometry, state = s.value("window/geometry", ""), s.value("window/state", "")
        self.toggle_gauges.setChecked(s.value("window/resources_panel", True))
        if state:  # docks first: a hidden panel lets the window be narrower
            self.restoreState(QByteArray.fromBase64(state.encode()))
        if geometry:
            self.restoreGeometry(QByteArray.fromBase64(geometry.encode()))
        last = s.value("window/view", "chat")
        self.show_view(last if last in {v[0] for v in VIEWS} else "chat")

    def _on_panel_visibility(self, visible: bool) -> None:
        # the window hiding (closing, minimising) hides the panel too: not the user's choice
        if self.isVisible() and not self._closing:
            self.toggle_gauges.setChecked(visible)

    def _restore_splitter(self, key: str, widget: QWidget) -> None:
        splitter = getattr(widget, "splitter", None)
        sizes = self.ctx.settings.value(f"window/splitter_{key}", [])
        if isinstance(splitter, QSplitter) and sizes and all(isinstance(n, int) for n in sizes):
            # the panes before the last keep their widths; the last takes what is left
            # (setSizes alone would scale them all to a window of another size)
            room = splitter.width() - splitter.handleWidth() * (len(sizes) - 1)
            if len(sizes) > 1 and room > sum(sizes[:-1]):
                sizes = [*sizes[:-1], room - sum(sizes[:-1])]
            splitter.setSizes(sizes)

    def save_state(self) -> None:
        """Save the layout (once the window closed, what it was when it closed stays)."""
        if self._closing and not self.isVisible():
            return
        s = self.ctx.settings
        s.set_value("window/geometry", bytes(self.saveGeometry().toBase64().data()).decode())
        s.set_value("window/state", bytes(self.saveState().toBase64().data()).decode())
        s.set_value("window/resources_panel", self.toggle_gauges.isChecked())
        for key, widget in self.views.items():  # the chat's list / transcript divide, ...
            splitter = getattr(widget, "splitter", None)
            if isinstance(splitter, QSplitter):
                s.set_value(f"window/splitter_{key}", splitter.sizes())
        current = self.current_view()
        s.set_value("window/view", next((k for k, w in self.views.items() if w is current),
                                        "chat"))

    def closeEvent(self, event: QCloseEvent) -> None:
        """Close at once; the worker stops in the background (it may take seconds to
        finish what it is doing: the window does not wait for it, and the event loop runs
        on meanwhile)."""
        self.save_state()
        self._closing = True
        super().closeEvent(event)
        if event.isAccepted():
            for view in self.views.values():  # an answer being written is saved as such
                closing = getattr(view, "window_closing", None)
                if callable(closing):
                    closing()
            QTimer.singleShot(0, functools.partial(self.ctx.shutdown, block=False))
            self.closed.emit()


def device_words(provider: Any) -> str:
    """The provider a model runs on, plainly."""
    text = str(provider or "")
    if "CUDA" in text:
        return "GPU (CUDA)"
    if "Dml" in text or "DirectML" in text:
        return "GPU (DirectML)"
    return "CPU"
