"""Which model the worker serves: names, the library under the model roots, load/unload.

Model ids contain the model's family (``qwen`` + ``coder`` for a Qwen FIM model) because
editors pick their FIM templates by name. Requests name a model by id or folder name,
case-insensitively, with Ollama's ``name:tag`` spelled either way (``a:1.5b`` = ``a-1.5b``);
an empty name means the loaded model (llama.vim sends ``"model": ""``).

Paths reach the loader only from the configured roots: a name is looked up under each root,
``..`` is refused, and the resolved folder (symlinks followed) must stay inside its root.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any, Literal

from engine.config import EngineConfig
from engine.engine import Engine
from engine.memory.trim import trim_heap
from engine.model.folders import FORMATS, find_model_dirs, folder_format
from engine.model.sampling_defaults import ModelSampling, model_sampling
from engine.server.errors import ApiError
from engine.server.worker import EngineWorker
from engine.text.fim import FimFamily

ModelState = Literal["empty", "loading", "ready"]
log = logging.getLogger("engine.server")

#: Words an editor looks for in a model name, and the tag added when a folder lacks them.
_FAMILY_WORDS: dict[str, tuple[tuple[str, ...], str]] = {
    "qwen": (("qwen", "coder"), "qwen-coder"),
    "starcoder": (("starcoder",), "starcoder"),
    "codellama": (("codellama",), "codellama"),
    "deepseek": (("deepseek",), "deepseek-coder"),
    "codestral": (("codestral",), "codestral"),
}


def model_id(folder_name: str, fim: FimFamily | None) -> str:
    """The id a folder's model is served under (see the module docstring)."""
    base = "-".join(folder_name.split()) or "model"
    if fim is None or fim.name not in _FAMILY_WORDS:
        return base
    words, tag = _FAMILY_WORDS[fim.name]
    if all(w in base.lower() for w in words):
        return base
    return f"{tag}-{base}"


def _norm(name: str) -> str:
    name = name.strip().lower()
    if name.endswith(":latest"):
        name = name[: -len(":latest")]
    return name.replace(":", "-")


def model_type(config: Any) -> str | None:
    """The architecture a model folder declares (``qwen2``, ``llama``...), if any."""
    if not isinstance(config, dict):
        return None
    inner = config.get("model")
    for source in (inner if isinstance(inner, dict) else {}, config):
        for key in ("type", "model_type"):
            value = source.get(key)
            if isinstance(value, str) and value:
                return value
    return None


@dataclass(frozen=True)
class LoadedModel:
    id: str
    engine: Engine
    path: Path
    loaded_at: float
    #: What the model recommends for the sampling fields a request leaves out.
    sampling: ModelSampling = field(default_factory=ModelSampling)

    @property
    def family(self) -> str:
        return model_type(self.engine.model.config) or "unknown"

    def matches(self, requested: str | None) -> bool:
        if not requested or not requested.strip():
            return True
        return _norm(requested) in {_norm(self.id), _norm(self.path.name)}


@dataclass(frozen=True)
class LibraryEntry:
    name: str  # the folder, relative to its root
    path: Path
    format: str
    family: str | None
    size_bytes: int


def _entry(root: Path, path: Path) -> LibraryEntry:
    fmt, family = folder_format(path), None
    marker = next((m for m, f in FORMATS if f == fmt), None)
    if marker is not None and marker.endswith(".json"):
        try:
            family = model_type(json.loads((path / marker).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            family = None
    size = sum(p.stat().st_size for p in path.iterdir()
               if p.is_file() and (p.suffix in (".onnx", ".data") or p.name.endswith(".onnx.data")))
    return LibraryEntry(path.relative_to(root).as_posix(), path, fmt, family, size)


class ModelManager:
    """The served model and the library; state changes happen on the event loop thread,
    engines are built and dropped on the engine thread."""

    def __init__(self, worker: EngineWorker, roots: Sequence[Path], config: EngineConfig,
                 trusted: Path | None = None, presets: Path | None = None) -> None:
        self._worker = worker
        #: The user's sampling presets (``presets.json``), read again at every load.
        self.presets = presets
        self.roots = tuple(Path(r).expanduser().resolve() for r in roots)
        self._config = config
        self._trusted = trusted.expanduser().resolve() if trusted is not None else None
        self._trusted_names: set[str] = set()
        if self._trusted is not None:
            self._trusted_names = {_norm(self._trusted.name), _norm(str(self._trusted))}
        #: Limits set while running (``PUT /v1/limits``): the user's, applied again after
        #: every model load, as a text ``parse_limit`` accepts, by tier.
        self.limits: dict[str, str] = {}
        self.current: LoadedModel | None = None
        self.state: ModelState = "empty"
        self.loading: str | None = None

    # --- the model requests run on -----------------------------------------------------

    def require(self, requested: str | None) -> LoadedModel:
        """The loaded model if ``requested`` names it (or is empty), else an ApiError."""
        if self.state == "loading":
            raise ApiError(503, f"the model {self.loading} is loading", code="model_loading",
                           retry_after_s=2, hint="retry in a few seconds")
        model = self.current
        if model is None:
            raise ApiError(503, "no model is loaded", code="model_not_loaded", retry_after_s=5,
                           hint="load one with POST /v1/models/load, or start the worker with "
                           "--model")
        if not model.matches(requested):
            raise ApiError(404, f"the model {requested!r} is not loaded here; this worker "
                           f"serves {model.id!r}", param="model", code="model_not_found",
                           hint=f"send \"model\": \"{model.id}\" (or an empty name)")
        return model

    def engine_for(self, model: LoadedModel) -> Engine:
        """``model.engine`` if it is still the served one (for jobs that start later)."""
        if self.current is not model:
            raise ApiError(503, f"the model {model.id} was unloaded while the request waited",
                           code="model_changed", retry_after_s=1, hint="send the request again")
        return model.engine

    # --- the library ------------------------------------------------------------------

    def set_roots(self, roots: Sequence[str | Path]) -> None:
        """The folders models may come from, replaced (absolute paths; ``~`` expanded)."""
        resolved = []
        for raw in roots:
            path = Path(raw).expanduser()
            if not path.is_absolute():
                raise ApiError(400, f"roots: {str(raw)!r} is not an absolute path",
                               param="roots", hint="send absolute folder paths")
            resolved.append(path.resolve())
        self.roots = tuple(dict.fromkeys(resolved))

    def library(self) -> list[LibraryEntry]:
        """Model folders under the roots (one or two levels deep); unreadable ones skipped."""
        entries: list[LibraryEntry] = []
        for root in self.roots:
            for path in find_model_dirs(root, 2, include_root=False, stay_inside=True):
                try:
                    entries.append(_entry(root, path))
                except OSError:
                    continue
        return entries

    def resolve(self, name: str) -> Path:
        """The folder ``name`` denotes inside a root (or the --model folder), or ApiError."""
        name = name.strip()
        if not name:
            raise ApiError(400, "model: empty name", param="model",
                           hint="name a folder from GET /v1/library")
        if self._trusted is not None and _norm(name) in self._trusted_names:
            return self._trusted
        pure = PurePath(name)
        if ".." in pure.parts or "\x00" in name:
            raise ApiError(400, f"model: {name!r} leaves the model folders", param="model",
                           code="path_not_allowed", hint="name a folder from GET /v1/library")
        for entry in self.library():
            if _norm(name) in {_norm(entry.name), _norm(entry.path.name)}:
                return entry.path
        for root in self.roots:
            candidate = Path(name) if pure.is_absolute() else root / name
            try:
                real = candidate.resolve()
                found = real.is_dir()
            except (OSError, ValueError) as exc:  # e.g. a name longer than the OS allows
                raise ApiError(400, f"model: not a usable folder name ({exc.__class__.__name__})",
                               param="model", hint="name a folder from GET /v1/library"
                               ) from exc
            if real.is_relative_to(root) and found:
                return real
        if pure.is_absolute():  # under none of the roots (each was tried above)
            raise ApiError(403, f"model: {name} is outside the configured model folders",
                           param="model", code="path_not_allowed",
                           hint="put the model under --models-dir")
        raise ApiError(404, f"model: no folder {name!r} under the model folders", param="model",
                       code="model_not_found", hint="GET /v1/library lists what can be loaded")

    # --- load / unload ----------------------------------------------------------------

    def config_for(self, path: Path, context_length: int | None = None) -> EngineConfig:
        """The configuration ``path`` loads with: the context capped at ``context_length``,
        else at the one its ``pull.json`` gives (a model pulled as "fits with a shorter
        context (N tokens)" loads with N, so its KV stays within the limit)."""
        from engine.hub.pull import pulled_context

        cap = context_length or pulled_context(path)
        if cap is None:
            return self._config
        if self._config.kv_max_len is not None:
            cap = min(cap, self._config.kv_max_len)
        log.info("%s loads with a %d-token context%s", path.name, cap,
                 "" if context_length else " (its pull.json: the context that fits here)")
        return replace(self._config, kv_max_len=cap)

    def load_now(self, path: Path) -> LoadedModel:
        """Load synchronously (at start-up, before the engine thread serves requests)."""
        engine = Engine.load(path, self.config_for(path))
        model = self._served(engine)
        self.current, self.state = model, "ready"
        if self._trusted is not None and model.path.resolve() == self._trusted:
            self._trusted_names.add(_norm(model.id))
        return model

    async def load(self, name: str, context_length: int | None = None) -> LoadedModel:
        """Load ``name`` on the engine thread (its context capped at ``context_length``,
        :meth:`config_for`); the old model is dropped first."""
        if self.state == "loading":
            raise ApiError(409, f"the model {self.loading} is already loading",
                           code="model_loading", retry_after_s=2)
        path = self.resolve(name)
        previous = [self.current] if self.current is not None else []
        self.current, self.state, self.loading = None, "loading", name
        config, limits = self.config_for(path, context_length), dict(self.limits)

        def job(cancel: Any) -> Iterator[Engine]:
            while previous:  # close the old engine and drop the last reference held here
                previous.pop().engine.close()
            gc.collect()  # the old engine's buffers go before the new ones arrive
            trim_heap()  # and leave the process: the next model's figures start clean
            engine = Engine.load(path, config)
            for tier, value in limits.items():  # the limits set since start stay set
                engine.set_limit(tier, value)
            yield engine

        try:
            handle = self._worker.submit(job, "high", exclusive=True)
            engines = [engine async for engine in handle]
        except BaseException:
            self.state, self.loading = "empty", None
            raise
        model = self._served(engines[0])
        self.current, self.state, self.loading = model, "ready", None
        return model

    def _served(self, engine: Engine) -> LoadedModel:
        name = model_id(engine.model.name, engine.fim_family)
        path = engine.model.path
        sampling = model_sampling(path, (name, path.name, engine.model.name), self.presets)
        for problem in sampling.problems:  # the rest of the preset still applies
            log.warning("sampling preset: %s", problem)
        return LoadedModel(name, engine, path, time.time(), sampling)

    async def unload(self) -> str | None:
        if self.state == "loading":
            raise ApiError(409, f"the model {self.loading} is loading", code="model_loading",
                           retry_after_s=2)
        model, self.current, self.state = self.current, None, "empty"
        if model is None:
            return None
        def job(cancel: Any) -> Iterator[None]:
            model.engine.close()
            gc.collect()
            trim_heap()
            yield None

        await asyncio.shield(self._drain(self._worker.submit(job, "high", exclusive=True)))
        return model.id

    @staticmethod
    async def _drain(handle: Any) -> None:
        async for _ in handle:
            pass
