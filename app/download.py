"""The app's downloads: :class:`engine.hub.download.Transfer` on its own Qt thread.

The protocol, resume, verification and the sentences are in ``engine.hub.download`` (the
worker and ``python -m engine pull`` use the same code); this module only carries them
to the view by signal.
"""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal

from engine.hub import DownloadCancelled, DownloadRequest, Transfer, explain

__all__ = ["DownloadJob"]

_RUNNING: set[DownloadJob] = set()  # alive until their thread ends, whatever the view does


class DownloadJob(QThread):
    """A download on its own thread; everything it says arrives by signal."""

    progress = Signal(object, object, str)  # bytes done, bytes in all, the current file
    stage = Signal(str)
    succeeded = Signal(object)  # DownloadOutcome
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, request: DownloadRequest, models_dir: Path,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.request = request
        self.models_dir = models_dir
        self._stop = threading.Event()
        self.finished.connect(self._forget)

    def start_download(self) -> None:
        _RUNNING.add(self)
        self.start()

    def cancel(self) -> None:
        self._stop.set()

    def _forget(self) -> None:
        self.wait(1000)  # run() has returned: finished is its last word; this joins at once
        _RUNNING.discard(self)

    def run(self) -> None:
        transfer = Transfer(self.request, self.models_dir, self._emit_progress,
                            self.stage.emit, self._stop.is_set)
        try:
            outcome = transfer.run()
        except DownloadCancelled:
            self.cancelled.emit()
        except Exception as exc:
            if self._stop.is_set():  # cancelled while a read hung, then timed out
                self.cancelled.emit()
            else:
                self.failed.emit(explain(exc, self.request))
        else:
            self.succeeded.emit(outcome)

    def _emit_progress(self, done: int, total: int, name: str) -> None:
        self.progress.emit(done, total, name)
