"""Models: the library (folders the user added, the Hugging Face and Foundry Local caches,
the app's downloads), what each model is, and load / unload / remove / download; the
Catalog tab (:class:`app.views.catalog_panel.CatalogPanel`) gets curated models.

Scans run on a pool thread (:class:`app.library.ScanTask`); the worker is told about new
folders (``PUT /v1/library/roots``, admin) and loads by absolute path
(``POST /v1/models/load``). Roots are merged with the worker's own list, never replaced
wholesale: a folder the worker was started with stays loadable.

``ask_folder`` and ``confirm`` are module-level so tests replace them (no modal dialog).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QSplitter,
    QStyle,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.client import ApiFailure, failure_from
from app.context import AppContext
from app.library import (
    LibraryModel,
    ScanResult,
    ScanTask,
    gpu_runtime_installed,
    human_size,
    library_roots,
)
from app.views import while_alive
from app.views.catalog_panel import CatalogPanel
from app.views.download_panel import DownloadPanel
from app.views.gauge_bar import plural
from app.views.gguf_panel import GGUFPanel
from app.views.models_table import ModelsTable, named, resolved

HIDDEN_KEY = "library/hidden"
_LOAD_TIMEOUT_MS = 15 * 60_000


def ask_folder(parent: QWidget | None) -> Path | None:
    """The folder the user picks, or None (replaced in tests)."""
    chosen = QFileDialog.getExistingDirectory(parent, "Add a folder of models")
    return Path(chosen) if chosen else None


def confirm(parent: QWidget | None, text: str) -> bool:
    """Yes / no from the user (replaced in tests)."""
    answer = QMessageBox.question(parent, "Models", text)
    return answer == QMessageBox.StandardButton.Yes


class _DeleteSignals(QObject):
    done = Signal(str, str)  # path, error ("" when deleted)


class _DeleteTask(QRunnable):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.signals = _DeleteSignals()

    def run(self) -> None:
        try:
            if self.path.is_symlink():
                self.path.unlink()  # a linked model: the link goes, its target stays
            else:
                shutil.rmtree(self.path)
        except OSError as exc:
            self.signals.done.emit(str(self.path), exc.strerror or str(exc))
            return
        self.signals.done.emit(str(self.path), "")


class ModelsView(QWidget):
    scanned = Signal(object)  # ScanResult, once the table shows it

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("models_view")
        self.ctx = ctx
        self.result: ScanResult | None = None
        self._resources: dict[str, Any] | None = None
        self._gpu_runtime = gpu_runtime_installed()
        self._tasks: set[QRunnable] = set()  # kept alive until their signal arrives
        self._scan_task: ScanTask | None = None
        self._last_scan: ScanTask | None = None  # kept until its pool thread is surely done
        self._scan_again = False
        self._build()
        ctx.model_changed.connect(self._on_model_changed)
        ctx.ready.connect(self._on_ready)
        self.refresh()

    # --- layout -------------------------------------------------------------------------

    def _button(self, text: str, name: str, slot: Callable[[], None]) -> QPushButton:
        button = named(QPushButton(text), name)
        button.clicked.connect(slot)
        return button

    def _build(self) -> None:
        self.add_folder_button = self._button("Add folder…", "add_folder", self.add_folder)
        self.remove_folder_button = self._button("Remove folder", "remove_folder",
                                                 self.remove_folder)
        self.refresh_button = self._button("Refresh", "refresh", self.refresh)
        self.load_button = self._button("Load", "load", self.load_selected)
        self.unload_button = self._button("Unload", "unload", self.unload)
        self.remove_button = self._button("Remove from library", "remove_model",
                                          self.remove_selected)
        self.roots = named(QListWidget(), "roots")
        self.roots.setMaximumHeight(110)
        self.table = ModelsTable()
        self.details = named(QLabel(""), "model_details")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.scan_status = named(QLabel(""), "scan_status")
        self.download = DownloadPanel(self.ctx, self)
        self.download.downloaded.connect(self._on_downloaded)
        self.gguf = GGUFPanel(self.ctx, self)  # Import GGUF…, and Ollama's / LM Studio's files
        self.gguf.imported.connect(self._on_downloaded)
        folder_row = QHBoxLayout()
        for w in (self.add_folder_button, self.remove_folder_button, self.refresh_button):
            folder_row.addWidget(w)
        folder_row.addStretch(1)
        folder_row.addWidget(self.scan_status)
        model_row = QHBoxLayout()
        for w in (self.load_button, self.unload_button, self.remove_button):
            model_row.addWidget(w)
        model_row.addStretch(1)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        split.addWidget(self.details)
        split.setStretchFactor(0, 3)
        self.catalog = CatalogPanel(self.ctx, self)
        self.catalog.pulled.connect(self._on_downloaded)
        self.tabs, library = named(QTabWidget(), "models_tabs"), QWidget()
        self.tabs.addTab(library, "Library")
        self.tabs.addTab(self.catalog, "Catalog")
        QVBoxLayout(self).addWidget(self.tabs)
        layout = QVBoxLayout(library)
        layout.addLayout(folder_row)
        layout.addWidget(self.roots)
        layout.addLayout(model_row)
        layout.addWidget(split, 1)
        layout.addWidget(self.download)
        layout.addWidget(self.gguf)
        self.table.itemSelectionChanged.connect(self._on_selection)
        self.roots.itemSelectionChanged.connect(self._update_buttons)
        self._update_buttons()

    # --- scanning -----------------------------------------------------------------------

    def refresh(self) -> None:
        """Scan the library again (on a pool thread)."""
        if self._scan_task is not None:
            self._scan_again = True
            return
        self.scan_status.setText("Scanning…")
        if self.ctx.client.is_configured:
            self._fetch_resources()
        roots = library_roots(self.ctx.settings.model_roots, self.ctx.paths.models_dir)
        task = ScanTask(roots, self._hidden())
        task.setAutoDelete(False)
        self._scan_task = task
        task.signals.done.connect(self._on_scanned)
        task.signals.failed.connect(self._on_scan_failed)
        QThreadPool.globalInstance().start(task)

    @property
    def scanning(self) -> bool:
        return self._scan_task is not None

    def _scan_ended(self) -> None:
        self._last_scan, self._scan_task = self._scan_task, None
        if self._scan_again:
            self._scan_again = False
            self.refresh()

    def _on_scanned(self, result: ScanResult) -> None:
        self.result = result
        self._fill_roots()
        self._fill_table()
        missing = sum(1 for s in result.roots if not s.available)
        self.scan_status.setText(
            f"{plural(len(result.models), 'model')} in {plural(len(result.roots), 'folder')}"
            + (f" ({missing} unavailable)" if missing else ""))
        self._scan_ended()
        self.scanned.emit(result)

    def _on_scan_failed(self, text: str) -> None:
        self.scan_status.setText(text)
        self.ctx.notice.emit("error", text)
        self._scan_ended()

    def _hidden(self) -> list[str]:
        return [str(h) for h in self.ctx.settings.value(HIDDEN_KEY, [])]

    # --- showing ------------------------------------------------------------------------

    def _fill_roots(self) -> None:
        self.roots.clear()
        for state in (self.result.roots if self.result else ()):
            item = QListWidgetItem(f"{state.root.label} — {state.note}")
            item.setData(Qt.ItemDataRole.UserRole, str(state.root.path))
            item.setData(Qt.ItemDataRole.UserRole + 1, state.root.kind)
            if not state.available:
                item.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning))
            self.roots.addItem(item)
        self._update_buttons()

    def _fill_table(self) -> None:
        self.table.fill(self.result.models if self.result else (), self.ctx.model,
                        self._gpu_runtime, self._resources)
        self._on_selection()

    def selected_model(self) -> LibraryModel | None:
        return self.table.selected_model()

    def is_loaded(self, model: LibraryModel) -> bool:
        return self.table.is_loaded(model)

    def _on_selection(self) -> None:
        model = self.selected_model()
        if model is None:
            self.details.setText("Select a model to see its details.")
        else:
            lines = [model.name, f"Folder: {model.path}",
                     f"From: {model.source} ({model.root})",
                     f"Weights: {human_size(model.weights_bytes) if model.weights_bytes else '?'}"
                     f"; on disk: {human_size(model.size_bytes)}"]
            if model.problem:
                lines.append(f"Problem: {model.problem}")
            lines += [f"Note: {w}" for w in model.warnings]
            self.details.setText("\n".join(lines))
        self._update_buttons()

    def _update_buttons(self) -> None:
        model = self.selected_model()
        root_item = self.roots.currentItem()
        kind = root_item.data(Qt.ItemDataRole.UserRole + 1) if root_item else None
        self.remove_folder_button.setEnabled(kind == "folder")
        self.load_button.setEnabled(model is not None and model.complete
                                    and not self.is_loaded(model))
        # the built-in model ships with the app: it cannot be removed (nor deleted)
        builtin = model is not None and model.source == "builtin"
        self.remove_button.setEnabled(model is not None and not builtin)
        self.remove_button.setToolTip("The built-in model comes with the app and stays in "
                                      "the library" if builtin else "")
        self.unload_button.setEnabled(self.ctx.model is not None)

    def _alive(self, fn: Callable[..., None]) -> Callable[..., None]:
        return while_alive(self, fn)

    # --- folders ------------------------------------------------------------------------

    def add_folder(self) -> None:
        folder = ask_folder(self)
        if folder is None:
            return
        folder = folder.expanduser().absolute()
        settings = self.ctx.settings
        settings.set_model_roots([*settings.model_roots, str(folder)])
        inside = [h for h in self._hidden() if not resolved(h).is_relative_to(resolved(folder))]
        settings.set_value(HIDDEN_KEY, inside)  # adding a folder again shows its models again
        self._change_worker_roots(add=[resolved(folder)], remove=[])
        self.refresh()

    def remove_folder(self) -> None:
        item = self.roots.currentItem()
        if item is None or item.data(Qt.ItemDataRole.UserRole + 1) != "folder":
            return
        path = str(item.data(Qt.ItemDataRole.UserRole))
        settings = self.ctx.settings
        settings.set_model_roots([r for r in settings.model_roots if str(Path(r)) != path])
        self._change_worker_roots(add=[], remove=[resolved(path)])
        self.refresh()

    def _change_worker_roots(self, add: list[Path], remove: list[Path],
                             then: Callable[[], None] | None = None,
                             failed: Callable[[ApiFailure], None] | None = None,
                             first: Path | None = None) -> None:
        """Merge into the worker's roots (``GET /v1/library``, then ``PUT`` when needed);
        ``first`` is moved to the front (the worker accepts an absolute model path only
        under its first root: ``ModelManager.resolve`` refuses at the first miss)."""
        on_fail = failed or (lambda f: self.ctx.report(f, "Could not tell the worker about "
                                                       "the model folders"))
        if not self.ctx.client.is_configured:
            on_fail(failure_from(0, b"", "the worker is not running"))
            return

        def put(body: Any) -> None:
            current = [Path(r) for r in (body or {}).get("roots", [])]
            roots = [r for r in current if r not in remove]
            roots += [r for r in add if r not in roots]
            if first is not None:
                roots = [first, *(r for r in roots if r != first)]
            if roots == current:
                if then:
                    then()
                return
            reply = self.ctx.client.call("PUT", "/v1/library/roots",
                                         {"roots": [str(r) for r in roots]}, admin=True)
            reply.finished.connect(self._alive(lambda _b: then() if then else None))
            reply.failed.connect(self._alive(on_fail))

        reply = self.ctx.client.get("/v1/library", admin=True)
        reply.finished.connect(self._alive(put))
        reply.failed.connect(self._alive(on_fail))

    # --- load / unload ------------------------------------------------------------------

    def load_selected(self) -> None:
        model = self.selected_model()
        if model is None:
            return
        if model.problem:
            self.ctx.notice.emit("warning", f"{model.name} cannot be loaded: {model.problem}")
            return
        self.ctx.busy.emit(f"Loading {model.name}…")
        self.load_button.setEnabled(False)
        real = resolved(model.path)
        root = resolved(model.root)
        access = root if real.is_relative_to(root) else real  # a link out of its root

        def fail(failure: ApiFailure) -> None:
            self.ctx.busy.emit("")
            self.ctx.report(failure, f"Could not load {model.name}")
            self._update_buttons()

        def post() -> None:
            reply = self.ctx.client.call("POST", "/v1/models/load", {"model": str(real)},
                                         admin=True, timeout_ms=_LOAD_TIMEOUT_MS)
            reply.finished.connect(self._alive(lambda body: self._on_loaded(model, body)))
            reply.failed.connect(self._alive(fail))

        self._change_worker_roots(add=[access], remove=[], then=post, failed=fail,
                                  first=access)

    def _on_loaded(self, model: LibraryModel, body: Any) -> None:
        self.ctx.busy.emit("")
        self.ctx.settings.set_value("library/last_model", str(model.path))
        self.ctx.notice.emit("info", f"Loaded {body.get('id', model.name)}")
        self.ctx.refresh_model()

    def unload(self) -> None:
        self.ctx.busy.emit("Unloading the model…")
        reply = self.ctx.client.call("POST", "/v1/models/unload", {}, admin=True)

        def done(_body: Any) -> None:
            self.ctx.busy.emit("")
            self.ctx.refresh_model()

        def fail(failure: ApiFailure) -> None:
            self.ctx.busy.emit("")
            self.ctx.report(failure, "Could not unload the model")

        reply.finished.connect(self._alive(done))
        reply.failed.connect(self._alive(fail))

    def _on_model_changed(self, _card: object) -> None:
        self._fill_table()

    def _on_downloaded(self, _outcome: object) -> None:
        self.refresh()

    def _on_ready(self) -> None:
        self._fetch_resources()
        self._fill_table()

    def _fetch_resources(self) -> None:
        reply = self.ctx.client.get("/v1/resources")

        def done(body: Any) -> None:
            self._resources = body if isinstance(body, dict) else None
            self._fill_table()

        reply.finished.connect(self._alive(done))  # without figures the column says what it can

    # --- removing -----------------------------------------------------------------------

    def remove_selected(self) -> None:
        """Hide the model; delete its files only when the user confirms."""
        model = self.selected_model()
        if model is None or model.source == "builtin":
            return
        if self.is_loaded(model):
            self.ctx.notice.emit("warning", f"{model.name} is loaded: unload it first")
            return
        self.ctx.settings.set_value(HIDDEN_KEY, [*self._hidden(), str(model.path)])
        question = (f"{model.name} is removed from the library. Also delete its files from "
                    f"disk ({human_size(model.size_bytes)} in {model.path})? This cannot be "
                    "undone.")
        if confirm(self, question):
            task = _DeleteTask(model.path)
            task.setAutoDelete(False)
            self._tasks.add(task)
            task.signals.done.connect(self._on_deleted)
            QThreadPool.globalInstance().start(task)
        self.refresh()

    def _on_deleted(self, path: str, error: str) -> None:
        if error:
            self.ctx.notice.emit("error", f"Could not delete {path}: {error}")
        else:
            self.ctx.notice.emit("info", f"Deleted {path}")
        self.refresh()
