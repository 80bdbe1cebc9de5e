"""The Models view's GGUF import: the GGUF files found in Ollama's and LM Studio's folders
with Import, "Import GGUF file…" for any other, a progress bar and Cancel.

The conversion (``python -m engine import-gguf``, :mod:`engine.model.gguf`) runs in a child
process, so the app stays responsive and its memory is given back when it ends; it writes
into the app's models folder (the library's "Downloads" root), where the library finds the
new folder on its next scan. Cancel ends the process and removes the half-written folder.

``ask_gguf_file`` is module-level so tests replace it (no modal dialog).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from PySide6.QtCore import QProcess, QProcessEnvironment, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.gguf_sources import GGUFFile, find_gguf_files, free_folder, import_command
from app.library import human_size
from app.views.models_table import named
from engine import import_work_dir

_STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")


def ask_gguf_file(parent: QWidget | None) -> Path | None:
    """The GGUF file the user picks, or None (replaced in tests)."""
    chosen, _ = QFileDialog.getOpenFileName(parent, "Import a GGUF model file", "",
                                            "GGUF models (*.gguf);;All files (*)")
    return Path(chosen) if chosen else None


class GGUFPanel(QGroupBox):
    """``imported(folder)`` when a conversion succeeded; ``ended(kind, text)`` with kind
    "done", "cancelled" or "failed"."""

    imported = Signal(object)  # Path
    ended = Signal(str, str)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__("GGUF files (Ollama, LM Studio, or any file)", parent)
        self.setObjectName("gguf")
        self.ctx = ctx
        self.process: QProcess | None = None
        self.target: Path | None = None
        self._cancelled = False
        self._errors: list[str] = []
        self.found = named(QListWidget(), "gguf_found")
        self.found.setMaximumHeight(110)
        self.import_button = named(QPushButton("Import"), "gguf_import")
        self.pick_button = named(QPushButton("Import GGUF…"), "gguf_pick")
        self.cancel_button = named(QPushButton("Cancel"), "gguf_cancel")
        self.bar = named(QProgressBar(), "gguf_progress")
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        self.status = named(QLabel(""), "gguf_status")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row = QHBoxLayout()
        row.addWidget(self.bar, 1)
        for button in (self.import_button, self.pick_button, self.cancel_button):
            row.addWidget(button)
        box = QVBoxLayout(self)
        box.addWidget(self.found)
        box.addLayout(row)
        box.addWidget(self.status)
        self.import_button.clicked.connect(self.import_selected)
        self.pick_button.clicked.connect(self.pick_and_import)
        self.cancel_button.clicked.connect(self.cancel)
        self.found.itemSelectionChanged.connect(self._update_buttons)
        self.rescan()

    # --- the list -----------------------------------------------------------------------

    def rescan(self) -> None:
        self.found.clear()
        files = find_gguf_files()
        for item in files:
            row = QListWidgetItem(f"{item.name} — {item.source}, {human_size(item.size)}")
            row.setData(Qt.ItemDataRole.UserRole, item)
            row.setToolTip(str(item.path))
            self.found.addItem(row)
        if not files and not self.running:
            self.status.setText("No GGUF files in Ollama's or LM Studio's folders; "
                                "\"Import GGUF…\" converts any .gguf file.")
        self._update_buttons()

    def selected_file(self) -> GGUFFile | None:
        item = self.found.currentItem()
        if item is None or not item.isSelected():
            return None
        value = item.data(Qt.ItemDataRole.UserRole)
        return value if isinstance(value, GGUFFile) else None

    @property
    def running(self) -> bool:
        return self.process is not None

    def _update_buttons(self) -> None:
        self.import_button.setEnabled(not self.running and self.selected_file() is not None)
        self.pick_button.setEnabled(not self.running)
        self.cancel_button.setEnabled(self.running)

    # --- importing ----------------------------------------------------------------------

    def import_selected(self) -> None:
        chosen = self.selected_file()
        if chosen is not None:
            self.start(chosen.path, chosen.folder_name)

    def pick_and_import(self) -> None:
        path = ask_gguf_file(self)
        if path is not None:
            self.start(path, GGUFFile(path, path.name, "file", 0).folder_name)

    def start(self, gguf: Path, name: str) -> None:
        """Convert ``gguf`` into a new folder ``name`` under the app's models folder."""
        if self.running:
            return
        models = self.ctx.paths.models_dir
        models.mkdir(parents=True, exist_ok=True)
        self.target = free_folder(models, name)
        program, args = import_command(gguf, self.target)
        process = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        here = str(Path(__file__).resolve().parents[2])  # finds `engine` when not installed
        env.insert("PYTHONPATH", os.pathsep.join(p for p in (here, env.value("PYTHONPATH"))
                                                 if p))
        process.setProcessEnvironment(env)
        process.readyReadStandardError.connect(self._on_stderr)
        process.finished.connect(self._on_finished)
        self.process, self._cancelled, self._errors = process, False, []
        self.bar.setRange(0, 1)
        self.bar.setValue(0)
        self.status.setText(f"Converting {gguf.name} into {self.target}…")
        self.ctx.busy.emit(f"Importing {gguf.name}…")
        self._update_buttons()
        process.start(program, args)

    def cancel(self) -> None:
        if self.process is not None:
            self._cancelled = True
            self.status.setText("Cancelling…")
            self.process.kill()

    def _on_stderr(self) -> None:
        if self.process is None:
            return
        text = bytes(self.process.readAllStandardError().data()).decode("utf-8", "replace")
        for line in text.splitlines():
            step = _STEP.match(line.strip())
            if step:
                done, total, what = int(step[1]), int(step[2]), step[3]
                self.bar.setRange(0, total)
                self.bar.setValue(done)
                self.status.setText(f"Converting: {what} ({done} of {total})")
            elif line.startswith(("error:", "fix:")):
                self._errors.append(line)

    def _on_finished(self, code: int, _status: QProcess.ExitStatus) -> None:
        process, target = self.process, self.target
        self._on_stderr()
        self.process = None
        self.ctx.busy.emit("")
        if process is not None:
            process.deleteLater()
        if (self._cancelled or code != 0) and target is not None:
            # a killed import leaves its work folder behind
            shutil.rmtree(import_work_dir(target), ignore_errors=True)
        if self._cancelled:
            self._finish("cancelled", "Import cancelled; nothing was kept.")
        elif code != 0:
            why = " ".join(self._errors) or f"the converter stopped (exit code {code})"
            self.ctx.notice.emit("error", f"GGUF import failed: {why}")
            self._finish("failed", f"Import failed: {why}")
        else:
            self.bar.setValue(self.bar.maximum())
            self.ctx.notice.emit("info", f"Imported into {target}")
            self._finish("done", f"Imported into {target}; it is listed in the library.")
            self.imported.emit(target)

    def _finish(self, kind: str, text: str) -> None:
        self.status.setText(text)
        self._update_buttons()
        self.ended.emit(kind, text)
