"""What every view shares: the HTTP client, the worker process, settings, the chat store,
and the worker's state as signals.

A view takes an :class:`AppContext` and listens:

- ``ready()``: the worker answers (the client is configured); fetch what you show.
- ``down(str)``: the worker stopped answering (a sentence saying why).
- ``model_changed(object)``: the loaded model's card (``dict`` from ``/v1/models``: ``id``,
  ``path``, ...) or ``None`` when none is loaded.
- ``notice(str, str)``: (level, text) for the status banner: "info" | "warning" | "error".
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from app.client import ApiFailure, WorkerClient
from app.paths import AppPaths, resources_dir
from app.settings import AppSettings
from app.worker import Crash, ReadyInfo, WorkerOptions, WorkerProcess


class AppContext(QObject):
    ready = Signal()
    down = Signal(str)
    model_changed = Signal(object)
    notice = Signal(str, str)
    busy = Signal(str)  # a long task's label ("Loading model…"); "" when done
    remote_probed = Signal(object)  # app.remote.RemoteCaps: what a remote server has

    def __init__(self, paths: AppPaths, settings: AppSettings | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.paths = paths.ensure()
        self.settings = settings or AppSettings(paths, self)
        self.client = WorkerClient(self)
        self.worker: WorkerProcess | None = None
        self.model: dict[str, Any] | None = None
        self.remote = False
        self.remote_caps: Any = None  # app.remote.RemoteCaps once probed
        self._probe: Any = None
        self.store: Any = None  # app.store.ChatStore, set by the app's builder

    # --- worker lifecycle -----------------------------------------------------------------

    def worker_options(self, model: str | None) -> WorkerOptions:
        s = self.settings
        # the user's folders, downloads and the built-in models: whatever the library lists
        # can be loaded (the worker loads only from its roots)
        builtin = resources_dir() / "models"
        roots = tuple(dict.fromkeys([*(r for r in s.model_roots if r),
                                     str(self.paths.models_dir), str(builtin)]))
        return WorkerOptions(model=model, models_dirs=roots, provider=s.provider, port=s.port,
                             api_key=s.api_key or None, threads=s.threads,
                             threads_stay_awake=s.threads_stay_awake, kv_dtype=s.kv_dtype,
                             host_ram_limit=s.host_ram_limit, vram_limit=s.vram_limit,
                             admin_token_file=str(self.paths.admin_token_file),
                             presets=str(self.paths.config_dir / "presets.json"))

    def remember_limit(self, tier: str, value: str) -> None:
        """The user's memory limit for ``tier``: saved, and given to every worker started
        from now on (the running one applies it to every model it loads)."""
        self.settings.set_value(f"limits/{tier}", value)
        if self.worker is not None:
            self.worker.set_limit(tier, value)

    def start_local(self, model: str | None) -> WorkerProcess:
        """Start (or restart) the local worker with ``model`` loaded."""
        self.remote = False
        self.remote_caps = None
        if self.worker is None:
            self.worker = WorkerProcess(self)
            self.worker.ready.connect(self._on_ready)
            self.worker.died.connect(self._on_died)
        self.worker.start(self.worker_options(model))
        return self.worker

    def use_remote(self, url: str, api_key: str | None) -> None:
        """Talk to a remote OpenAI-compatible server instead of a local worker."""
        if self.worker is not None:
            self.worker.stop()
        from app.remote import RemoteProbe

        self.remote = True
        self.remote_caps = None
        self.client.configure(url, api_key)
        self.ready.emit()
        self.refresh_model()
        self._probe = RemoteProbe(self.client, self)
        self._probe.done.connect(self._on_probed)

    def _on_probed(self, caps: Any) -> None:
        self.remote_caps = caps
        self.remote_probed.emit(caps)

    def shutdown(self, block: bool = True) -> None:
        """Stop the local worker (``block=False``: in the background; its ``state_changed``
        says ``stopped`` once it is gone)."""
        if self.worker is not None:
            self.worker.stop(block=block)

    def worker_gone(self) -> bool:
        """No local worker process is left (none started, stopped, or never came up)."""
        return self.worker is None or self.worker.state in ("stopped", "failed")

    def _on_ready(self, info: ReadyInfo) -> None:
        self.client.configure(info.url, self.settings.api_key or None, info.admin_token)
        self.ready.emit()
        self.refresh_model()

    def _on_died(self, crash: Crash) -> None:
        self.down.emit(crash.diagnosis)
        self.set_model(None)

    # --- the loaded model -----------------------------------------------------------------

    def set_model(self, card: dict[str, Any] | None) -> None:
        self.model = card
        path = (card or {}).get("meta", {}).get("path")
        if self.worker is not None and path:
            self.worker.set_model(str(path))
        self.model_changed.emit(card)

    def refresh_model(self) -> None:
        """Ask the worker which model it serves (``/v1/models``)."""
        reply = self.client.get("/v1/models")

        def done(body: Any) -> None:
            data = body.get("data") if isinstance(body, dict) else None
            card = data[0] if isinstance(data, list) and data else None
            self.set_model(card if isinstance(card, dict) else None)

        reply.finished.connect(done)
        reply.failed.connect(lambda f: self.report(f, "Could not ask the worker for its model"))

    def report(self, failure: ApiFailure, what: str) -> None:
        """A failed call as a banner: what happened and what to do."""
        self.notice.emit("error", f"{what}: {failure.text()}")
