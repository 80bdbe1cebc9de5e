"""Editor set-up: point llama.vscode, llama.vim, Continue or Tabby at this app's worker.

Shows the worker's endpoint (it follows the worker when it restarts on another port), and
per editor the settings to paste, with Copy and Test buttons. Test replays the editor's
own requests (``app.editor_clients``) against the worker and says whether they would work,
and if not, why.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.editor_clients import CLIENTS, ClientTest, EditorClient

NO_ENDPOINT = "http://127.0.0.1:PORT"


def _mono_box(name: str) -> QPlainTextEdit:
    box = QPlainTextEdit()
    box.setObjectName(name)
    box.setReadOnly(True)
    box.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    box.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
    return box


def _copy(text: str) -> None:
    QGuiApplication.clipboard().setText(text)


class ClientSection(QGroupBox):
    """One editor: where its settings go, the settings, Copy, Test and the verdict."""

    def __init__(self, client: EditorClient, parent: QWidget | None = None) -> None:
        super().__init__(client.name, parent)
        self.client = client
        self.setObjectName(f"editor-{client.key}")
        self.where = QLabel(f"Paste into {client.where}:")
        self.settings_box = _mono_box(f"settings-{client.key}")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setObjectName(f"copy-{client.key}")
        self.copy_button.clicked.connect(lambda: _copy(self.settings_box.toPlainText()))
        self.test_button = QPushButton("Test")
        self.test_button.setObjectName(f"test-{client.key}")
        self.test_button.setToolTip("Send this editor's own requests to the worker")
        self.result = QLabel("")
        self.result.setObjectName(f"result-{client.key}")
        self.result.setWordWrap(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.copy_button)
        buttons.addWidget(self.test_button)
        buttons.addWidget(self.result, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.where)
        layout.addWidget(self.settings_box)
        layout.addLayout(buttons)

    def show_settings(self, text: str) -> None:
        self.settings_box.setPlainText(text)
        lines = text.count("\n") + 1
        metrics = self.settings_box.fontMetrics()
        margins = self.settings_box.contentsMargins()
        self.settings_box.setFixedHeight(lines * metrics.lineSpacing() + margins.top()
                                         + margins.bottom() + 12)


class EditorSetupView(QWidget):
    """The Editors view (see the module docstring)."""

    #: (client key, passed, what happened)
    test_finished = Signal(str, bool, str)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("editorSetupView")
        self.ctx = ctx
        self._tests: dict[str, ClientTest] = {}
        intro = QLabel("Code editors can use this app's worker for completions while you "
                       "type. Point them at the endpoint below, then press Test.")
        intro.setWordWrap(True)
        self.endpoint = QLineEdit()
        self.endpoint.setObjectName("editorsEndpoint")
        self.endpoint.setReadOnly(True)
        self.endpoint.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.copy_endpoint = QPushButton("Copy")
        self.copy_endpoint.setObjectName("copyEndpoint")
        self.copy_endpoint.clicked.connect(lambda: _copy(self.endpoint.text()))
        row = QHBoxLayout()
        row.addWidget(QLabel("Endpoint:"))
        row.addWidget(self.endpoint, 1)
        row.addWidget(self.copy_endpoint)
        self.hint = QLabel("")
        self.hint.setObjectName("editorsHint")
        self.hint.setWordWrap(True)
        self.hint.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.sections = {c.key: ClientSection(c) for c in CLIENTS}
        inner = QWidget()
        column = QVBoxLayout(inner)
        column.addWidget(intro)
        column.addLayout(row)
        column.addWidget(self.hint)
        for key, section in self.sections.items():
            section.test_button.clicked.connect(lambda _=False, k=key: self.run_test(k))
            column.addWidget(section)
        column.addStretch(1)
        scroll = QScrollArea()
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidgetResizable(True)
        scroll.setWidget(inner)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(scroll)
        ctx.client.configured.connect(lambda _url: self.refresh())
        ctx.model_changed.connect(lambda _card: self.refresh())
        ctx.settings.changed.connect(self._on_setting)
        self.refresh()

    # --- what is shown ------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return str((self.ctx.model or {}).get("id") or "")

    def refresh(self) -> None:
        """Endpoint, hint and every editor's settings from the worker as it is now."""
        url = self.ctx.client.base_url
        self.endpoint.setText(url or "(the worker has not started yet)")
        self.copy_endpoint.setEnabled(bool(url))
        key = self.ctx.client.api_key or ""
        model = self.model_id or "NAME-OF-THE-LOADED-MODEL"
        for section in self.sections.values():
            section.show_settings(section.client.settings(url or NO_ENDPOINT, model, key))
        self.hint.setText(self._hint_text())

    def _hint_text(self) -> str:
        notes = []
        if not self.model_id:
            notes.append("No model is loaded: Continue and Tabby need its name, and no "
                         "editor gets completions until a code model is loaded.")
        if not self.ctx.remote and self.ctx.settings.port == 0:
            notes.append("The port changes each time the worker starts: set a fixed port "
                         "in Settings so editors keep finding it (llama.vim and "
                         "llama.vscode expect 8012 unless told otherwise).")
        if self.ctx.client.api_key:
            notes.append("The worker needs an API key; the settings below include it.")
        return "\n".join(notes)

    def _on_setting(self, key: str) -> None:
        if key.startswith("worker/"):
            self.refresh()

    # --- tests ----------------------------------------------------------------------------

    def run_test(self, key: str) -> None:
        """Replay the editor's requests against the worker (the Test button)."""
        section = self.sections[key]
        old = self._tests.pop(key, None)
        if old is not None:
            old.abort()
            old.deleteLater()
        if not self.ctx.client.is_configured:
            self._show_result(key, False, "the worker has not started yet")
            return
        test = ClientTest(section.client, self.ctx.client, self.model_id,
                          self.ctx.client.api_key or "", self)
        test.passed.connect(lambda text: self._show_result(key, True, text))
        test.failed.connect(lambda text: self._show_result(key, False, text))
        self._tests[key] = test
        section.test_button.setEnabled(False)
        section.result.setText("Testing…")
        test.start()

    def _show_result(self, key: str, ok: bool, text: str) -> None:
        section = self.sections[key]
        section.test_button.setEnabled(True)
        section.result.setText(f"✔ Passed — {text}" if ok else f"✖ Failed — {text}")
        self.test_finished.emit(key, ok, text)
