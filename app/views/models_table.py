"""The Models view's table: one row per library model, the loaded one marked (● and
bold), problems flagged with a warning icon in the Status column."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QStyle,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from app.library import LibraryModel, human_size, where_it_runs

COLUMNS = ("Model", "Format", "Size", "Context", "Quantization", "FIM", "Chat template",
           "Runs on", "Status")
W = TypeVar("W", bound=QWidget)


def named(widget: W, name: str) -> W:
    """``widget`` with its objectName set (tests and screenshots find it by name)."""
    widget.setObjectName(name)
    return widget


def resolved(path: str | Path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(path)


class ModelsTable(QTableWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(COLUMNS), parent)
        self.setObjectName("models")
        self.models: tuple[LibraryModel, ...] = ()
        self.loaded: Path | None = None
        self.setHorizontalHeaderLabels(list(COLUMNS))
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().setVisible(False)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)

    def is_loaded(self, model: LibraryModel) -> bool:
        return self.loaded is not None and resolved(model.path) == self.loaded

    def fill(self, models: Sequence[LibraryModel], card: dict[str, Any] | None,
             gpu_runtime: bool, resources: dict[str, Any] | None) -> None:
        """Show ``models``; ``card`` is the loaded model's (``/v1/models``), if any."""
        selected = self.selected_model()
        meta = (card or {}).get("meta") or {}
        self.loaded = resolved(meta["path"]) if meta.get("path") else None
        self.models = tuple(models)
        self.setRowCount(len(self.models))
        warn = self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning)
        for row, model in enumerate(self.models):
            loaded = self.is_loaded(model)
            runs = where_it_runs(model, loaded_provider=meta.get("provider") if loaded else None,
                                 gpu_runtime=gpu_runtime, resources=resources)
            for col, text in enumerate(self._texts(model, loaded, runs)):
                item = QTableWidgetItem(text)
                item.setToolTip(str(model.path) if col == 0 else text)
                if loaded:
                    font = QFont(item.font())
                    font.setBold(True)
                    item.setFont(font)
                if col == len(COLUMNS) - 1 and model.problem:
                    item.setIcon(warn)
                self.setItem(row, col, item)
            if selected is not None and model.path == selected.path:
                self.selectRow(row)

    @staticmethod
    def _texts(model: LibraryModel, loaded: bool, runs: str) -> list[str]:
        return [("● " if loaded else "") + model.name, model.format,
                human_size(model.size_bytes),
                str(model.context_length) if model.context_length else "?",
                model.quantization, model.fim or "—", "yes" if model.chat_template else "no",
                runs, "loaded" if loaded else (model.problem or "ready")]

    def cell(self, row: int, column: str) -> str:
        item = self.item(row, COLUMNS.index(column))
        return item.text() if item is not None else ""

    def row_of(self, name: str) -> int:
        """The row showing the model called ``name`` (-1: none)."""
        return next((i for i, m in enumerate(self.models) if m.name == name), -1)

    def selected_model(self) -> LibraryModel | None:
        selection = self.selectionModel()
        rows = selection.selectedRows() if selection is not None else []
        if not rows or rows[0].row() >= len(self.models):
            return None
        return self.models[rows[0].row()]
