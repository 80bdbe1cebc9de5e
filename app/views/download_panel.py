"""The Models view's download form: a Hugging Face repo id (and an optional subfolder), a
progress bar in bytes, Cancel, and a resume by pressing Download again.

The download runs on its own thread (:class:`app.download.DownloadJob`, running
:class:`engine.hub.Transfer`); the hub endpoint is the ``library/hf_endpoint`` setting,
else ``$HF_ENDPOINT``, else huggingface.co.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.download import DownloadJob
from app.library import human_size
from app.views.models_table import named
from engine.hub import DownloadOutcome, DownloadRequest, describe_outcome, hub_endpoint

ENDPOINT_KEY = "library/hf_endpoint"
_SCALE = 1000  # the bar counts per mille: byte counts overflow its int range


class DownloadPanel(QGroupBox):
    """``ended(kind, text)``: kind is "done", "cancelled" or "failed"."""

    downloaded = Signal(object)  # DownloadOutcome
    ended = Signal(str, str)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__("Download from Hugging Face", parent)
        self.setObjectName("download")
        self.ctx = ctx
        self.job: DownloadJob | None = None
        self._done = self._total = 0
        self.repo_edit = named(QLineEdit(), "download_repo")
        self.repo_edit.setPlaceholderText("owner/name, e.g. microsoft/Phi-3-mini-4k-instruct-onnx")
        self.subfolder_edit = named(QLineEdit(), "download_subfolder")
        self.subfolder_edit.setPlaceholderText(
            "optional, e.g. cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4")
        self.start_button = named(QPushButton("Download"), "download_start")
        self.cancel_button = named(QPushButton("Cancel"), "download_cancel")
        self.cancel_button.setEnabled(False)
        self.bar = named(QProgressBar(), "download_progress")
        self.bar.setRange(0, _SCALE)
        self.bar.setValue(0)
        self.bar.setTextVisible(True)
        self.bar.setFormat("")
        self.bar.hide()  # shown while a download runs
        self.status = named(QLabel(""), "download_status")
        self.status.setWordWrap(True)
        self._layout()
        self.start_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.repo_edit.returnPressed.connect(self.start)

    def _layout(self) -> None:
        form = QFormLayout()
        form.addRow("Repository", self.repo_edit)
        form.addRow("Subfolder", self.subfolder_edit)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.bar, 8)
        buttons.addStretch(1)
        box = QVBoxLayout(self)
        box.addLayout(form)
        box.addLayout(buttons)
        box.addWidget(self.status)

    @property
    def running(self) -> bool:
        return self.job is not None

    def start(self) -> None:
        repo = self.repo_edit.text().strip()
        if self.running:
            return
        if not repo:
            self.status.setText("Type a repository id such as owner/name.")
            return
        request = DownloadRequest(repo, self.subfolder_edit.text().strip().strip("/"),
                                  endpoint=hub_endpoint(self.ctx.settings.value(ENDPOINT_KEY,
                                                                                "")))
        job = DownloadJob(request, self.ctx.paths.models_dir)
        job.progress.connect(self._on_progress)
        job.stage.connect(self.status.setText)
        job.succeeded.connect(self._on_succeeded)
        job.failed.connect(self._on_failed)
        job.cancelled.connect(self._on_cancelled)
        self.job = job
        self._set_running(True)
        self.status.setText(f"Starting {request.label}…")
        job.start_download()

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.cancel_button.setEnabled(False)
            self.status.setText("Cancelling…")

    def _set_running(self, running: bool) -> None:
        self.bar.setVisible(running)
        self.start_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        self.repo_edit.setEnabled(not running)
        self.subfolder_edit.setEnabled(not running)

    def _finish(self, kind: str, text: str) -> None:
        self.job = None
        self._set_running(False)
        self.status.setText(text)
        self.ended.emit(kind, text)

    def _on_progress(self, done: int, total: int, name: str) -> None:
        self._done, self._total = done, total
        self.bar.setValue(int(done * _SCALE / total) if total else 0)
        self.bar.setFormat(f"{human_size(done)} of {human_size(total)}")
        if name:
            self.status.setText(f"Downloading {name}")

    def _on_succeeded(self, outcome: DownloadOutcome) -> None:
        text = describe_outcome(outcome)
        self.bar.setValue(_SCALE)
        self.ctx.notice.emit("warning" if outcome.problem else "info", text)
        self._finish("done", text)
        self.downloaded.emit(outcome)

    def _on_failed(self, text: str) -> None:
        self.ctx.notice.emit("error", f"Download failed: {text}")
        self._finish("failed", f"Download failed: {text}")

    def _on_cancelled(self) -> None:
        self._finish("cancelled", f"Cancelled at {human_size(self._done)} of "
                     f"{human_size(self._total)}; press Download to continue where it "
                     "stopped.")
