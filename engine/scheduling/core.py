"""What the scheduler and pressure relief may use of an engine: two small protocols.

:class:`EngineCore` is the part of :class:`~engine.engine.Engine` that runs requests and
holds their memory; the scheduler (``engine.scheduling.scheduler``) and pressure relief
(``engine.scheduling.pressure``) see the engine only through it, never its private fields.
:class:`Preemptor` is what pressure relief asks of the scheduler. Arrows point down:
engine -> scheduler -> pressure -> this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from engine.api import GenerateRequest
from engine.config import EngineConfig, GenerateOptions
from engine.generation.request import RequestRun
from engine.kv.cache import PagePool, PrefixCache
from engine.kv.reuse import KVReuse
from engine.kv.sessions import Session, SessionStore
from engine.kv.tiers import KVTiers
from engine.memory.governor import Governor
from engine.runtime.runner import DecodeRunner


class Preemptor(Protocol):
    """A scheduler as pressure relief sees it."""

    def running(self) -> list[RequestRun]:
        """The requests that hold a runner now."""
        ...

    def preempt_for_memory(self, over: Callable[[], bool], release: Callable[[], None]) -> int:
        ...

    def release_parked_kv(self) -> int:
        ...


class EngineCore(Protocol):
    """The engine's runners, KV and memory, and the steps of one request's life."""

    config: EngineConfig
    governor: Governor
    pool: PagePool
    prefix_cache: PrefixCache | None
    sessions: SessionStore
    reuse: KVReuse
    kv_tiers: KVTiers | None
    #: One runner per concurrently running sequence; runner 0 serves `Engine.stream`.
    runners: list[DecodeRunner]
    #: The scheduler that runs this engine's requests, once one exists: a live limit
    #: change preempts its requests.
    active_scheduler: Preemptor | None

    def kv_bytes(self) -> int: ...

    def add_runner(self) -> DecodeRunner | None: ...

    def encode_request(self, request: GenerateRequest) -> list[int]: ...

    def request_total(self, prompt_len: int, options: GenerateOptions) -> int: ...

    def fit_prompt(self, prompt: list[int], options: GenerateOptions,
                   in_session: bool = False) -> list[int]: ...

    def start_run(self, request: GenerateRequest, prompt: list[int], session: Session | None,
                  cancel: threading.Event | None, started: float,
                  runner: DecodeRunner | None = None, dropped: int = 0) -> RequestRun: ...

    def end_run(self, run: RequestRun, session: Session | None) -> None: ...

    def run_ended(self) -> None:
        """A request left the engine without ``end_run`` (it failed): background work that
        pauses while requests run (the huge-page collapse) may go on."""
        ...
