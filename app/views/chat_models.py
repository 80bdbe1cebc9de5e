"""The chat header's model picker: the library's models (what the worker can load, from
``GET /v1/library``), the loaded one marked; picking another loads it
(``POST /v1/models/load``). With a remote server: the models it lists (``/v1/models``);
picking one sends the chat to that model."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QWidget

from app.client import ApiFailure
from app.context import AppContext
from app.views import while_alive

LOADED_MARK = "● "
LOAD_TIMEOUT_MS = 300_000
WAITING = "waiting for the worker…"
#: The picker's width in characters, whatever it lists (longer names end in "…", whole in
#: the tooltip): a worker restart or a long model name never moves the header.
WIDTH_CHARS = 20
TIP = "The model that answers: the loaded one is marked ●; pick another to load it"


class ModelPicker(QComboBox):
    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatModelPicker")
        self.setToolTip(TIP)
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(WIDTH_CHARS)
        self.ctx = ctx
        self.loading: str | None = None
        self.activated.connect(self._on_picked)
        self.currentIndexChanged.connect(self._tip)
        ctx.model_changed.connect(lambda _card: self.refresh())
        ctx.remote_probed.connect(lambda _caps: self.refresh())
        ctx.down.connect(self._on_down)
        self._show([], WAITING)
        self.refresh()

    def _worker_coming(self) -> bool:
        worker = self.ctx.worker
        return worker is not None and worker.state in ("starting", "restarting")

    def _on_down(self, _why: str) -> None:
        self._show([], WAITING if self._worker_coming() else
                   "no model: the worker is not running")

    def _tip(self, index: int) -> None:
        text = self.itemText(index) if index >= 0 else ""
        detail = self.itemData(index, Qt.ItemDataRole.ToolTipRole) if index >= 0 else None
        self.setToolTip(f"{text}\n{detail or TIP}" if text else TIP)

    def entries(self) -> list[tuple[str, str, bool]]:
        """(shown text, what picking it loads, loaded) for each item."""
        return [(self.itemText(i), str(self.itemData(i)), self.itemText(i).startswith(
            LOADED_MARK)) for i in range(self.count()) if self.itemData(i) is not None]

    def refresh(self) -> None:
        if not self.ctx.client.is_configured:
            return
        loaded = str((self.ctx.model or {}).get("id") or "")
        if self.ctx.remote:
            caps = self.ctx.remote_caps
            ids = list(getattr(caps, "models", None) or ([loaded] if loaded else []))
            self._show([(i.rstrip("/").rsplit("/", 1)[-1], i, i == loaded) for i in ids],
                       "this server lists no model")
            return
        reply = self.ctx.client.get("/v1/library", admin=True)
        reply.finished.connect(self._on_library)
        reply.failed.connect(self._on_library_failed)

    def _on_library_failed(self, failure: ApiFailure) -> None:
        if self._worker_coming():
            self._show([], WAITING)
        else:
            self._show([], "the library could not be read", failure.message)

    def _on_library(self, body: Any) -> None:
        models = body.get("models") if isinstance(body, dict) else None
        items = [(str(m.get("name")), str(m.get("path")), bool(m.get("loaded")))
                 for m in models or [] if isinstance(m, dict) and m.get("path")]
        card = self.ctx.model or {}
        path = (card.get("meta") or {}).get("path")
        if card.get("id") and path and not any(loaded for *_, loaded in items):
            # a model loaded from outside the library (`--model DIR`) is still the one
            # that answers: listed first, marked, never another model in its place
            items.insert(0, (str(card["id"]), str(path), True))
        self._show(items, "no model in the library: add a folder in Models")

    def _show(self, items: list[tuple[str, str, bool]], empty: str, why: str = "") -> None:
        self.blockSignals(True)
        self.clear()
        if not items:
            self.addItem(empty, None)
            if why:
                self.setItemData(0, why, Qt.ItemDataRole.ToolTipRole)
        current = 0
        for n, (name, key, loaded) in enumerate(items):
            self.addItem((LOADED_MARK if loaded else "") + name, key)
            if loaded:
                current = n
        self.setCurrentIndex(current)
        self.blockSignals(False)
        self._tip(current)

    def _on_picked(self, index: int) -> None:
        key = self.itemData(index)
        if key is None or self.itemText(index).startswith(LOADED_MARK):
            return
        name = self.itemText(index)
        if self.ctx.remote:
            meta = (self.ctx.model or {}).get("meta") or {}
            self.ctx.set_model({"id": key, "meta": {k: v for k, v in meta.items()
                                                    if k != "path"}})
            return
        self.loading = str(key)
        self.setEnabled(False)
        self.ctx.busy.emit(f"Loading {name}…")
        reply = self.ctx.client.call("POST", "/v1/models/load", {"model": key}, admin=True,
                                     timeout_ms=LOAD_TIMEOUT_MS)
        reply.finished.connect(while_alive(self, lambda _body: self._loaded(str(key))))
        reply.failed.connect(while_alive(self, lambda failure: self._failed(name, failure)))

    def _loaded(self, path: str) -> None:
        self.loading = None
        self.setEnabled(True)
        self.ctx.busy.emit("")
        self.ctx.settings.set_value("library/last_model", path)
        self.ctx.refresh_model()

    def _failed(self, name: str, failure: ApiFailure) -> None:
        self.loading = None
        self.setEnabled(True)
        self.ctx.busy.emit("")
        self.ctx.report(failure, f"Could not load {name}")
        self.refresh()
