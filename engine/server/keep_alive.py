"""Ollama's ``keep_alive`` and ``/api/ps``: how long the model stays loaded after a request.

``keep_alive`` is a number of seconds or a Go duration (``"30s"``, ``"5m"``, ``"1h30m"``);
``0`` unloads the model once the request has answered, a negative value keeps it loaded
for good, a positive one unloads it after that long without requests. Without
``keep_alive`` the model stays loaded (the worker also serves the app and other dialects;
Ollama's own default is five minutes). A model unloaded this way is loaded again by the
next Ollama request that names it (or names none), as Ollama does.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from engine.server.errors import ApiError
from engine.server.models import LoadedModel, ModelManager, _norm

log = logging.getLogger(__name__)

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
#: What /api/ps says for a model kept loaded for good (Ollama prints a far-future date too).
FOREVER_S = 10 * 365 * 86400.0


def parse_keep_alive(value: str | int | float | None) -> float | None:
    """Seconds to keep the model (``inf`` for good), or ``None`` when not given."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float("inf") if value < 0 else float(value)
    text = str(value).strip()
    if not text:
        return None
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    try:
        seconds = float(body)  # a bare number is seconds ("0", "300")
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _PART.finditer(body):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_S[match.group(2)]
            pos = match.end()
        if pos != len(body) or not body:
            raise ApiError(400, f"keep_alive: {value!r} is not a duration", param="keep_alive",
                           hint='send seconds (300), a duration ("5m", "1h30m"), 0 to unload '
                           "after this request, or -1 to keep the model loaded") from None
    return float("inf") if sign < 0 else seconds


@dataclass
class KeepAlive:
    """The unload timer of the served model, and what keep_alive unloaded (to reload)."""

    models: ModelManager
    expires_at: float | None = None  # wall-clock time; None: loaded for good
    unloaded: Path | None = None
    unloaded_id: str | None = None
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    _busy: int = 0

    def begin(self) -> None:
        """A request starts: no unload while it runs."""
        self._busy += 1
        self._cancel_timer()

    async def end(self, seconds: float | None) -> None:
        """The request answered; apply its ``keep_alive`` (None: the previous setting)."""
        self._busy = max(self._busy - 1, 0)
        if seconds is None:
            seconds = None if self.expires_at is None else max(self.expires_at - time.time(), 0)
            if seconds is None:
                return
        if seconds == float("inf"):
            self.expires_at = None
            return
        self.expires_at = time.time() + seconds
        if seconds == 0:
            if self._busy == 0:
                await self.unload()
            return
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(seconds, lambda: loop.create_task(self._expire()))

    async def _expire(self) -> None:
        if self._busy == 0 and self.expires_at is not None and time.time() >= self.expires_at:
            await self.unload()

    async def unload(self) -> None:
        self._cancel_timer()
        model = self.models.current
        if model is None or self.models.state != "ready":
            return
        self.unloaded, self.unloaded_id = model.path, model.id
        self.expires_at = None
        try:
            await self.models.unload()
        except ApiError:  # a load started meanwhile: that one wins
            log.info("keep_alive: the model was busy loading; nothing unloaded")

    async def model_for(self, name: str) -> LoadedModel:
        """The served model for an Ollama request, loading the one keep_alive unloaded."""
        models = self.models
        if (models.current is None and models.state == "empty" and self.unloaded is not None
                and (not name or _same(name, self.unloaded_id, self.unloaded))):
            await models.load(str(self.unloaded))
            self.unloaded = self.unloaded_id = None
        return models.require(name)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _same(name: str, model_id: str | None, path: Path) -> bool:
    return _norm(name) in {_norm(model_id or ""), _norm(path.name), _norm(str(path))}


_STATES: weakref.WeakKeyDictionary[ModelManager, KeepAlive] = weakref.WeakKeyDictionary()


def keep_alive_of(models: ModelManager) -> KeepAlive:
    """The one KeepAlive of a worker's model manager."""
    state = _STATES.get(models)
    if state is None:
        state = _STATES[models] = KeepAlive(models)
    return state
