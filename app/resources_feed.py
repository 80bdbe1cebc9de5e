"""The worker's resources as a live feed: ``GET /v1/resources/stream`` kept open.

:class:`ResourcesFeed` subscribes once the worker answers (at once when the client is
already configured, and on every ``ctx.ready``: a restarted worker is a new stream). When
the stream drops without the worker being declared down (a remote server, a network
hiccup) it subscribes again after a back-off; ``ctx.down`` stops it until the next
``ready``. Each event is emitted as ``snapshot(dict)`` (the ``/v1/resources`` body) and
kept as a :class:`Sample` for the last ``window_s`` seconds, for the chart.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.client import ApiFailure, SseStream, single_shot
from app.context import AppContext

#: Seconds before subscribing again after the stream dropped, by attempt.
RETRY_S = (0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class Sample:
    """One event's figures for the chart (None: not measured / no such tier)."""

    t: float  # the app's clock (time.monotonic), seconds
    ram_used: int | None
    vram_used: int | None
    kv_bytes: int | None
    tokens_per_s: float | None
    ttft_ms: float | None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def sample_of(body: dict[str, Any], t: float) -> Sample:
    """The chart's figures from a ``/v1/resources`` body (any part may be missing)."""
    gov = _dict(body.get("governor"))
    kv = _dict(body.get("kv"))
    ram, vram = _dict(gov.get("host_ram")), _dict(gov.get("vram"))
    last = _dict(_dict(body.get("throughput")).get("last"))
    tps, ttft = last.get("tokens_per_s"), last.get("ttft_ms")
    return Sample(t, _int(ram.get("used")) if ram else None,
                  _int(vram.get("used")) if vram.get("capacity") is not None else None,
                  _int(kv.get("held_bytes")),
                  float(tps) if isinstance(tps, (int, float)) else None,
                  float(ttft) if isinstance(ttft, (int, float)) else None)


class ResourcesFeed(QObject):
    """``snapshot(dict)`` about every ``interval_s`` while a worker answers."""

    snapshot = Signal(object)  # the /v1/resources body
    state_changed = Signal(str)  # idle | connecting | live | retrying | down | unsupported
    problem = Signal(str)  # why there are no figures, in words

    def __init__(self, ctx: AppContext, parent: QObject | None = None, *,
                 interval_s: float = 1.0, window_s: float = 300.0) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.interval_s = interval_s
        self.window_s = window_s
        self.state = "idle"
        self.last: dict[str, Any] | None = None
        self.events = 0  # events received since this feed was made
        self._samples: collections.deque[Sample] = collections.deque()
        self._stream: SseStream | None = None
        self._attempt = 0
        self._retry = single_shot(int(RETRY_S[0] * 1000), self)
        self._retry.timeout.connect(self.subscribe)
        ctx.ready.connect(self._on_ready)
        ctx.down.connect(self._on_down)
        ctx.remote_probed.connect(self._on_probed)
        if ctx.client.is_configured:
            self.subscribe()

    # --- public ---------------------------------------------------------------------------

    @property
    def history(self) -> list[Sample]:
        return list(self._samples)

    def subscribe(self) -> None:
        """(Re)open the stream now."""
        self._retry.stop()
        self._drop_stream()
        if not self.ctx.client.is_configured:
            self._set_state("idle")
            return
        if not self._subscribable():
            self._set_state("unsupported")
            return
        path = f"/v1/resources/stream?interval_s={self.interval_s:g}"
        stream = self.ctx.client.stream("GET", path)
        # bound methods (the sender is the stream): Qt drops them when this feed goes, and
        # the stream (the client's child) is aborted with it
        stream.message.connect(self._on_message)
        stream.finished.connect(self._on_ended)
        stream.failed.connect(self._on_failed)
        self.destroyed.connect(stream.abort)
        self._stream = stream
        self._set_state("connecting")

    def stop(self) -> None:
        """Close the stream and stop retrying (until the next ``ctx.ready``)."""
        self._retry.stop()
        self._drop_stream()
        self._set_state("idle")

    # --- events ---------------------------------------------------------------------------

    def _on_ready(self) -> None:
        self._attempt = 0
        self.subscribe()

    def _on_probed(self, caps: Any) -> None:
        if not getattr(caps, "has_resources", True):
            self._retry.stop()
            self._drop_stream()
            self._set_state("unsupported")
            self.problem.emit("Not reported by this server: it has no resources feed.")

    def _subscribable(self) -> bool:
        caps = self.ctx.remote_caps
        return not (self.ctx.remote and caps is not None and not caps.has_resources)

    def _on_down(self, _why: str) -> None:
        self._retry.stop()
        self._drop_stream()
        self._set_state("down")
        self.problem.emit("The worker is not running: no figures until it is back.")

    def _on_message(self, payload: Any) -> None:
        if not isinstance(payload, dict):
            return
        self._attempt = 0
        self.events += 1
        self.last = payload
        now = time.monotonic()
        self._samples.append(sample_of(payload, now))
        while self._samples and now - self._samples[0].t > self.window_s:
            self._samples.popleft()
        self._set_state("live")
        self.snapshot.emit(payload)

    def _on_ended(self) -> None:
        self._on_lost(None, self.sender())

    def _on_failed(self, failure: ApiFailure) -> None:
        self._on_lost(failure, self.sender())

    def _on_lost(self, failure: ApiFailure | None, stream: QObject) -> None:
        if stream is None or stream is not self._stream:
            return  # an old stream ending after a re-subscribe
        self._stream = None
        stream.deleteLater()
        if failure is not None and failure.status in (401, 403, 404, 405):
            self._set_state("unsupported")
            self.problem.emit("Not reported by this server: it has no resources feed "
                              f"(it answered HTTP {failure.status}).")
            return
        delay = RETRY_S[min(self._attempt, len(RETRY_S) - 1)]
        self._attempt += 1
        self._retry.setInterval(int(delay * 1000))
        self._retry.start()
        self._set_state("retrying")
        why = failure.message if failure is not None else "the stream ended"
        self.problem.emit(f"Lost the worker's figures: {why.rstrip('.')}. Trying again in "
                          f"{delay:g} s.")

    def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.abort()
            stream.deleteLater()

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)
