"""The Models page's Catalog tab: the engine's curated models (``engine.hub``), each with
what this machine would get of it and its fit label ("fits", "fits with a shorter
context (N tokens)", "too big") and expected speed; the numbers behind a label are shown
when its row is selected. **Get** pulls the selected model (the best GGUF that fits,
converted; or the ONNX folder) into the app's model folder with progress and Cancel, then
loads it, so it is ready in the chat's model picker. **Search the Hub** adds, below the
catalog, the repositories of a search (GGUF and ONNX text generation only) with the same
labels.

The Hub is read on a thread when the tab is first shown (or on **Check the Hub**): file
sizes and configs come from there, never from the catalog file. The endpoint is the
``library/hf_endpoint`` setting, else ``$HF_ENDPOINT``, else huggingface.co; the label is
judged under the RAM/VRAM limits of the app's settings.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import QThread, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.views import while_alive
from app.views.download_panel import ENDPOINT_KEY
from app.views.models_table import named
from engine import EngineConfig, human_size
from engine.hub import (
    CatalogEntry,
    CatalogRow,
    DownloadCancelled,
    DownloadError,
    PullEvent,
    PullResult,
    catalog_rows,
    hub_endpoint,
    load_catalog,
    pull_model,
    read_speed,
    search_hub,
)

COLUMNS = ("Model", "Kind", "Format", "Takes", "Download", "Here")
_SCALE = 1000


class _Job(QThread):
    """``work(report, cancelled)`` on its own thread; its result or error by signal."""

    report = Signal(object)
    succeeded = Signal(object)
    failed = Signal(str)

    def __init__(self, work: Any, parent: QWidget) -> None:
        super().__init__(parent)
        self._work = work
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self.succeeded.emit(self._work(self.report.emit, self.stop.is_set))
        except DownloadCancelled:
            self.failed.emit("Cancelled: Get again continues where it stopped.")
        except DownloadError as exc:
            self.failed.emit(exc.message)
        except Exception as exc:
            self.failed.emit(f"{type(exc).__name__}: {exc}")


class CatalogPanel(QWidget):
    pulled = Signal(object)  # PullResult

    def __init__(self, ctx: AppContext, parent: QWidget | None = None,
                 entries: tuple[CatalogEntry, ...] | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("catalog")
        self.ctx = ctx
        self.entries = load_catalog() if entries is None else entries
        self.rows: list[CatalogRow] = [CatalogRow(e, None, "not checked yet")
                                       for e in self.entries]
        self.check_job: _Job | None = None
        self.pull_job: _Job | None = None
        self.table = named(QTableWidget(0, len(COLUMNS)), "catalog_table")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.details = named(QLabel(""), "catalog_details")
        self.details.setWordWrap(True)
        self.check_button = named(QPushButton("Check the Hub"), "catalog_check")
        self.query = named(QLineEdit(), "catalog_query")
        self.query.setPlaceholderText("a model the catalog lacks, e.g. SmolLM2 or Phi-3")
        self.search_button = named(QPushButton("Search the Hub"), "catalog_search")
        self.get_button = named(QPushButton("Get"), "catalog_get")
        self.cancel_button = named(QPushButton("Cancel"), "catalog_cancel")
        self.bar = named(QProgressBar(), "catalog_progress")
        self.bar.setRange(0, _SCALE)
        self.status = named(QLabel(""), "catalog_status")
        self.status.setWordWrap(True)
        row = QHBoxLayout()
        for w in (self.check_button, self.bar, self.get_button, self.cancel_button):
            row.addWidget(w, 1 if w is self.bar else 0)
        search = QHBoxLayout()
        search.addWidget(self.query, 1)
        search.addWidget(self.search_button)
        layout = QVBoxLayout(self)
        layout.addLayout(search)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.details)
        layout.addLayout(row)
        layout.addWidget(self.status)
        self.check_button.clicked.connect(self.check)
        self.search_button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.get_button.clicked.connect(self.get_selected)
        self.cancel_button.clicked.connect(self.cancel)
        self.table.itemSelectionChanged.connect(self._on_selection)
        self._fill()
        self._update_buttons()

    # --- the Hub's view of each entry ----------------------------------------------------

    def _endpoint(self) -> str:
        return hub_endpoint(self.ctx.settings.value(ENDPOINT_KEY, ""))

    def _config(self) -> EngineConfig:
        s = self.ctx.settings
        return EngineConfig(host_ram_limit=s.host_ram_limit, vram_limit=s.vram_limit)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.rows and all(r.problem == "not checked yet" for r in self.rows):
            self.check()

    def check(self) -> None:
        if self.check_job is not None:
            return
        endpoint, config, entries = self._endpoint(), self._config(), self.entries
        job = _Job(lambda _report, _stop: catalog_rows(
            endpoint=endpoint, config=config, bandwidth=read_speed, entries=entries), self)
        job.succeeded.connect(self._on_checked)
        job.failed.connect(self.status.setText)
        job.finished.connect(self._check_ended)
        self.check_job = job
        self.status.setText(f"Reading {endpoint}…")
        self._update_buttons()
        job.start()

    def search(self) -> None:
        text = self.query.text().strip()
        if self.check_job is not None or not text:
            return
        endpoint, config = self._endpoint(), self._config()

        def work(_report: Any, _stop: Any) -> list[CatalogRow]:
            hits = tuple(hit.entry() for hit in search_hub(text, endpoint=endpoint))
            return catalog_rows(endpoint=endpoint, config=config, bandwidth=read_speed,
                                entries=hits)

        job = _Job(work, self)
        job.succeeded.connect(self._on_found)
        job.failed.connect(self.status.setText)
        job.finished.connect(self._check_ended)
        self.check_job = job
        self.status.setText(f"Searching {endpoint} for {text!r}…")
        self._update_buttons()
        job.start()

    def _on_found(self, rows: list[CatalogRow]) -> None:
        self.rows = [r for r in self.rows if r.entry in self.entries] + rows
        self._fill()
        self.status.setText(f"{len(rows)} repositories found (GGUF and ONNX text "
                            "generation), labelled for this machine" if rows else
                            "Nothing this engine runs was found for that search")

    def _check_ended(self) -> None:
        self.check_job = None
        self._update_buttons()

    def _on_checked(self, rows: list[CatalogRow]) -> None:
        self.rows = rows
        self._fill()
        problems = {r.problem for r in rows if r.problem}
        self.status.setText("; ".join(sorted(problems)) if problems else
                            f"{len(rows)} models checked against this machine's limits")

    def label_of(self, row: CatalogRow) -> str:
        if row.choice is None:
            return row.problem or ""
        fit = row.choice.fit
        speed = f", about {fit.tokens_per_second:.0f} tokens/s" if fit.tokens_per_second \
            else ""
        return fit.text + speed

    def _fill(self) -> None:
        self.table.setRowCount(len(self.rows))
        for i, row in enumerate(self.rows):
            e, c = row.entry, row.choice
            kind = e.kind + (" (FIM)" if e.fim else "") if e in self.entries else "Hub search"
            cells = (e.title, kind, e.format,
                     c.quant if c else e.quantization,
                     human_size(c.download_bytes) if c else "", self.label_of(row))
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(c.fit.details() if c else (row.problem or text))
                self.table.setItem(i, j, item)
        self.table.resizeColumnsToContents()

    def selected(self) -> CatalogRow | None:
        picked = self.table.selectionModel().selectedRows()
        return self.rows[picked[0].row()] if picked else None

    def _on_selection(self) -> None:
        row = self.selected()
        if row is not None:
            e, c = row.entry, row.choice
            facts = (f"{e.title}: {e.parameters} parameters, {e.context} tokens of context, "
                     f"licence {e.license}; tools: {'yes' if e.tools else 'no'}, reasoning: "
                     f"{'yes' if e.reasoning else 'no'}. From {e.source}"
                     if e in self.entries else f"{e.repo}, found on the Hub: {e.source}")
            self.details.setText(facts + ("\n" + c.fit.details() if c else ""))
        self._update_buttons()

    # --- Get: pull, then load ----------------------------------------------------------

    def get_selected(self) -> None:
        row = self.selected()
        if row is None or self.pull_job is not None:
            return
        endpoint, config, folder = self._endpoint(), self._config(), self.ctx.paths.models_dir
        name, entries = row.entry.name, self.entries
        job = _Job(lambda report, stop: pull_model(
            name, folder, endpoint=endpoint, config=config, progress=report, cancelled=stop,
            entries=entries), self)
        job.report.connect(self._on_report)
        job.succeeded.connect(self._on_pulled)
        job.failed.connect(self._on_pull_failed)
        job.finished.connect(self._pull_ended)
        self.pull_job = job
        self.bar.setValue(0)
        self.status.setText(f"Getting {row.entry.title}…")
        self._update_buttons()
        job.start()

    def get_entry(self, entry: CatalogEntry) -> None:
        """Select ``entry`` (added to the table if it is not there) and Get it: the
        welcome's suggestions start here."""
        index = next((i for i, r in enumerate(self.rows) if r.entry.name == entry.name), None)
        if index is None:
            self.rows.append(CatalogRow(entry, None, "not checked yet"))
            self._fill()
            index = len(self.rows) - 1
        self.table.selectRow(index)
        self.get_selected()

    def cancel(self) -> None:
        if self.pull_job is not None:
            self.pull_job.stop.set()
            self.status.setText("Cancelling…")

    def _on_report(self, event: PullEvent) -> None:
        if event.total:
            self.bar.setValue(int((event.completed or 0) * _SCALE / event.total))
            self.bar.setFormat(f"{human_size(event.completed or 0)} of "
                               f"{human_size(event.total)}")
        else:
            self.status.setText(event.status[:1].upper() + event.status[1:])

    def _on_pull_failed(self, text: str) -> None:
        self.status.setText(text)
        self.ctx.notice.emit("warning", text)

    def _pull_ended(self) -> None:
        self.pull_job = None
        self._update_buttons()

    def _on_pulled(self, result: PullResult) -> None:
        self.bar.setValue(_SCALE)
        self.status.setText(result.summary[:1].upper() + result.summary[1:]
                            + "; loading it…")
        self.pulled.emit(result)
        body: dict[str, Any] = {"model": str(result.folder)}
        if result.context_length:  # "fits with a shorter context (N tokens)": load with N
            body["context_length"] = result.context_length
        reply = self.ctx.client.call("POST", "/v1/models/load", body, admin=True,
                                     timeout_ms=15 * 60_000)
        reply.finished.connect(while_alive(self, lambda body: self._on_loaded(result, body)))
        reply.failed.connect(lambda failure: self.ctx.report(
            failure, f"Could not load {result.folder.name}"))

    def _on_loaded(self, result: PullResult, body: Any) -> None:
        self.ctx.settings.set_value("library/last_model", str(result.folder))
        context = (body.get("meta") or {}).get("context_length")
        with_context = f" with a {context}-token context" if context else ""
        self.status.setText(f"Loaded {body.get('id', result.folder.name)}{with_context}: "
                            "ready in the chat's model picker")
        self.ctx.refresh_model()

    def _update_buttons(self) -> None:
        pulling = self.pull_job is not None
        self.get_button.setEnabled(not pulling and self.selected() is not None)
        self.cancel_button.setEnabled(pulling)
        self.check_button.setEnabled(self.check_job is None)
        self.search_button.setEnabled(self.check_job is None)
