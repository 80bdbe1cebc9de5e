"""Settings: where the model runs, the worker's port and API key, a remote server, threads.

Providers that this install cannot use are greyed out with the reason (the onnxruntime
variant installed decides: read from package metadata, without importing onnxruntime).
Applying restarts the worker with the new options; the loaded model is loaded again.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.theme import THEME_KEY, THEME_LABELS, THEMES, apply_theme, saved_theme
from app.views import named
from engine import installed_ort_variants

RESTARTING = "Restarting the worker with the new settings…"
PROVIDER_LABELS = {"auto": "Automatic (GPU when it fits, else CPU)", "cpu": "CPU",
                   "cuda": "CUDA (NVIDIA GPU)", "dml": "DirectML (Windows GPU)"}
#: The worker's --kv-dtype choices (app.settings.KV_CHOICES), as the view names them.
KV_LABELS = {"auto": "Automatic (16-bit; 8-bit when memory is tight)",
             "float16": "16-bit floating point",
             "int16": "16-bit whole numbers (faster on CPUs with VNNI)",
             "int8": "8-bit (a quarter of 32-bit's memory)"}


def provider_availability() -> dict[str, str | None]:
    """provider → None when usable, else why not."""
    variants = installed_ort_variants()  # package metadata only: onnxruntime is not imported
    reasons: dict[str, str | None] = {"auto": None, "cpu": None}
    reasons["cuda"] = None if "onnxruntime-gpu" in variants else (
        "needs the onnxruntime-gpu package (the 'cuda' extra) and an NVIDIA GPU")
    reasons["dml"] = None if "onnxruntime-directml" in variants else (
        "needs Windows and the onnxruntime-directml package (the 'directml' extra)")
    if not variants:
        reasons["cpu"] = "no onnxruntime package is installed"
    return reasons


class SettingsView(QWidget):
    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        layout = QVBoxLayout(self)
        layout.addWidget(self._look_box())
        layout.addWidget(self._worker_box())
        layout.addWidget(self._remote_box())
        layout.addWidget(self._paths_box())
        buttons = QHBoxLayout()
        self.apply_button = named(QPushButton("Apply and restart worker"), "applySettings")
        self.restart_button = named(QPushButton("Restart worker"), "restartWorker")
        self.result = named(QLabel(""), "settingsResult")
        self.result.setWordWrap(True)
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.restart_button)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        layout.addWidget(self.result)
        layout.addStretch(1)
        self.apply_button.clicked.connect(self.apply)
        self.restart_button.clicked.connect(self.restart)
        ctx.ready.connect(self._on_restarted)
        ctx.remote_probed.connect(lambda caps: self.result.setText(caps.words()))
        self.load()

    def _look_box(self) -> QGroupBox:
        box = QGroupBox("Appearance")
        form = QFormLayout(box)
        self.theme = named(QComboBox(), "theme")
        for key in THEMES:
            self.theme.addItem(THEME_LABELS[key], key)
        self.theme.setCurrentIndex(THEMES.index(saved_theme(self.ctx.settings)))
        self.theme.setToolTip("Light or dark colours; As the system follows the desktop's "
                              "choice. Applies at once.")
        self.theme.currentIndexChanged.connect(self._on_theme)
        form.addRow("Colours", self.theme)
        return box

    def _on_theme(self, index: int) -> None:
        theme = str(self.theme.itemData(index))
        self.ctx.settings.set_value(THEME_KEY, theme)
        apply_theme(theme)

    def _worker_box(self) -> QGroupBox:
        box = QGroupBox("Local worker")
        form = QFormLayout(box)
        self.provider = named(QComboBox(), "provider")
        availability = provider_availability()
        model = self.provider.model()
        for key, label in PROVIDER_LABELS.items():
            reason = availability.get(key)
            self.provider.addItem(label if reason is None else f"{label} — {reason}", key)
            if reason is not None and isinstance(model, QStandardItemModel):
                item = model.item(self.provider.count() - 1)
                item.setEnabled(False)
                item.setToolTip(reason)
        self.port = named(QSpinBox(), "port")
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")
        self.threads = named(QSpinBox(), "threads")
        self.threads.setRange(0, 256)
        self.threads.setSpecialValueText("automatic")
        self.stay_awake = named(QCheckBox("Keep model threads awake between steps"),
                                "threadsStayAwake")
        self.stay_awake.setToolTip(
            "On: threads wait a few microseconds for the next step instead of sleeping "
            "(1.2-1.7x faster answers on a quiet computer; no CPU used once an "
            "answer is done).\nOff: may be faster when other programs keep every core "
            "busy all the time.")
        self.kv_dtype = named(QComboBox(), "kvDtype")
        for key, label in KV_LABELS.items():
            self.kv_dtype.addItem(label, key)
        self.kv_dtype.setToolTip(
            "How the model keeps what a conversation has said so far (its KV cache).\n"
            "16-bit: half the memory of 32-bit; the same answers every time. Whole numbers "
            "are faster on CPUs with AVX-512 VNNI or AVX-VNNI; floating point keeps a little more "
            "precision (the two may answer differently).\n8-bit: about "
            "a quarter of it, for long conversations on small computers; answers may "
            "differ a little from 16-bit's.\nAutomatic: 16-bit (whole numbers where the "
            "CPU runs them fast), or 8-bit when the memory "
            "limit cannot hold the model's whole context in 16-bit.")
        self.api_key = named(QLineEdit(), "apiKey")
        self.api_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.api_key.setPlaceholderText("none: only programs on this computer can connect")
        form.addRow("Run models on", self.provider)
        form.addRow("Port", self.port)
        form.addRow("CPU threads", self.threads)
        form.addRow("", self.stay_awake)
        form.addRow("Conversation memory", self.kv_dtype)
        form.addRow("API key for editors", self.api_key)
        return box

    def _remote_box(self) -> QGroupBox:
        box = QGroupBox("Remote server (instead of the local worker)")
        form = QFormLayout(box)
        self.remote_url = named(QLineEdit(), "remoteUrl")
        self.remote_url.setPlaceholderText("e.g. http://192.168.1.20:8000/v1 — empty: run "
                                           "models on this computer")
        form.addRow("OpenAI-compatible URL", self.remote_url)
        return box

    def _paths_box(self) -> QGroupBox:
        box = QGroupBox("Where things live")
        form = QFormLayout(box)
        paths = self.ctx.paths
        for label, path in (("Chats", paths.chats_db), ("Downloaded models", paths.models_dir),
                            ("Settings", paths.config_dir / "settings.ini")):
            value = QLabel(str(path))
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            form.addRow(label, value)
        self.worker_log = named(QLabel(self._log_words()), "workerLog")
        self.worker_log.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.worker_log.setWordWrap(True)
        form.addRow("Worker log", self.worker_log)
        return box

    def _log_words(self) -> str:
        worker = self.ctx.worker
        info = worker.info if worker is not None and not self.ctx.remote else None
        if info is None:
            return "the remote server keeps its own" if self.ctx.remote else \
                "shown once the worker has started"
        return info.log_file or "none: the worker writes to its standard error only"

    def load(self) -> None:
        s = self.ctx.settings
        index = self.provider.findData(s.provider)
        self.provider.setCurrentIndex(max(0, index))
        self.port.setValue(s.port)
        self.threads.setValue(s.threads)
        self.stay_awake.setChecked(s.threads_stay_awake)
        self.kv_dtype.setCurrentIndex(max(0, self.kv_dtype.findData(s.kv_dtype)))
        self.api_key.setText(s.api_key)
        self.remote_url.setText(s.remote_url)

    def apply(self) -> None:
        s = self.ctx.settings
        url = self.remote_url.text().strip()
        if url and not url.startswith(("http://", "https://")):
            self.result.setText("The remote URL must start with http:// or https://.")
            return
        s.set_value("worker/provider", self.provider.currentData())
        s.set_value("worker/port", self.port.value())
        s.set_value("worker/threads", self.threads.value())
        s.set_value("worker/threads_stay_awake", self.stay_awake.isChecked())
        s.set_value("worker/kv_dtype", self.kv_dtype.currentData())
        s.set_value("worker/api_key", self.api_key.text().strip())
        s.set_value("worker/remote_url", url)
        self.restart()

    def restart(self) -> None:
        s = self.ctx.settings
        if s.remote_url:
            self.ctx.use_remote(s.remote_url, s.api_key or None)
            self.result.setText(f"Using the remote server at {s.remote_url}.")
            return
        model = self.ctx.worker.options.model if self.ctx.worker else None
        self.ctx.start_local(model)
        self.result.setText(RESTARTING)

    def _on_restarted(self) -> None:
        self.worker_log.setText(self._log_words())
        if self.result.text() == RESTARTING:
            self.result.setText("The worker is running with the new settings.")
