"""The engine thread: the one thread that touches an Engine, and the queue in front of it.

The asyncio side calls :meth:`EngineWorker.submit` with a job function and gets a
:class:`JobHandle` back at once. The job function runs later on the engine thread; every
item it yields is handed to the event loop (``loop.call_soon_threadsafe``) and read with
``async for item in handle``. ``handle.cancel()`` sets the job's cancel flag, which the
engine checks once per token; a job cancelled while it waits never starts.

Jobs run together: each round the thread takes one item from every running job, most
urgent first (high, normal, low; then oldest). Generation jobs pull their events from the
engine's scheduler (``engine.scheduling.scheduler``), so one round is one scheduler step that
advances, and batches, every running generation; an urgent prompt is prefilled alone
first. ``exclusive`` jobs (loading or unloading a model) run alone: they start when the
running jobs have finished and hold new ones back until they are done.

:meth:`EngineWorker.call` is for short work that must happen on the engine thread but is
not a job (a resource snapshot, a limit change, closing a session): it runs between two
rounds, within about one token, however many jobs run or wait, and never counts against
the queue. A call that waited while a model loaded runs once the load is done.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
Priority = Literal["low", "normal", "high"]
#: A job: called on the engine thread with the job's cancel flag; yields items.
JobFn = Callable[[threading.Event], Iterator[T]]

_ITEM, _ERROR, _DONE = "item", "error", "done"


class QueueFullError(Exception):
    """Too many requests wait for the engine; retry after ``retry_after_s`` seconds."""

    def __init__(self, waiting: int, retry_after_s: int) -> None:
        self.waiting = waiting
        self.retry_after_s = retry_after_s
        super().__init__(f"{waiting} requests are already waiting for the engine")


class WorkerStoppedError(Exception):
    """The worker is shutting down; the job did not run (or was cut short)."""


class JobHandle(Generic[T]):
    """The asyncio side of one job: ``async for item in handle``; ``cancel()``.

    Iteration raises the job's exception, if it raised one, after its earlier items.
    """

    def __init__(self, job_id: int, priority: Priority, loop: asyncio.AbstractEventLoop) -> None:
        self.id = job_id
        self.priority = priority
        self.cancel_event = threading.Event()
        self._loop = loop
        self._items: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
        self._finished = False

    def cancel(self) -> None:
        """Ask the job to stop: before it starts, or at its next token."""
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def __aiter__(self) -> JobHandle[T]:
        return self

    async def __anext__(self) -> T:
        if self._finished:
            raise StopAsyncIteration
        kind, value = await self._items.get()
        if kind == _ITEM:
            return value  # type: ignore[return-value]
        self._finished = True
        if kind == _ERROR:
            assert isinstance(value, BaseException)
            raise value
        raise StopAsyncIteration

    # --- called on the engine thread ---------------------------------------------------

    def _post(self, kind: str, value: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel_event.set()


class _Call(Generic[T]):
    """A function for the engine thread and the future its result goes to."""

    def __init__(self, fn: Callable[[], T], future: asyncio.Future[T],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.future = future
        self.loop = loop

    def run(self) -> None:
        if self.future.cancelled():  # the caller stopped waiting: skip the work
            return
        try:
            value = self.fn()
        except Exception as exc:
            self.settle(exc, None)
            return
        self.settle(None, value)

    def settle(self, error: BaseException | None, value: T | None) -> None:
        def finish() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)  # type: ignore[arg-type]

        with suppress(RuntimeError):  # a closed event loop: nobody is waiting any more
            self.loop.call_soon_threadsafe(finish)


@dataclass(frozen=True)
class JobRecord:
    """What one finished job did (the last few are kept for /metrics and tests)."""

    id: int
    priority: Priority
    wait_s: float
    run_s: float
    items: int
    #: Items flagged ``is_step`` (tokens) that the job yielded after it was cancelled.
    steps_after_cancel: int
    cancelled: bool
    error: str | None


_RANK = {"high": 0, "normal": 1, "low": 2}


@dataclass
class _Job(Generic[T]):
    fn: JobFn[T]
    handle: JobHandle[T]
    queued_at: float
    exclusive: bool = False
    started: float = 0.0
    gen: Iterator[T] | None = None
    items: int = 0
    after_cancel: int = 0


class EngineWorker:
    """One engine thread and its FIFO queue (see the module docstring)."""

    def __init__(self, *, max_queue: int = 64, max_running: int = 1,
                 history: int = 256) -> None:
        self.max_queue = max_queue
        #: Jobs the engine runs at once (its batch); more than that wait.
        self.max_running = max_running
        self._queue: queue.Queue[_Job[object] | _Call[Any] | None] = queue.Queue()
        self._ids = itertools.count(1)
        self._active: list[_Job[object]] = []
        self._held: deque[_Job[object]] = deque()  # admitted later (an exclusive job runs)
        self._pending = 0  # submitted and not finished
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.history: deque[JobRecord] = deque(maxlen=history)
        self.on_record: Callable[[JobRecord], None] | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def waiting(self) -> int:
        """Jobs beyond what the engine runs at once."""
        return max(0, self._pending - self.max_running)

    @property
    def idle(self) -> bool:
        """True when no job runs and none waits."""
        return not self._active and not self._held and self._pending == 0

    def submit(self, fn: JobFn[T], priority: Priority = "normal", *,
               exclusive: bool = False) -> JobHandle[T]:
        """Queue ``fn`` for the engine thread; call from the event loop's thread."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._stopping:
                raise WorkerStoppedError("the worker is shutting down")
            if self._pending >= self.max_running + self.max_queue:
                raise QueueFullError(self.waiting, self._retry_after())
            self._pending += 1
            handle: JobHandle[T] = JobHandle(next(self._ids), priority, loop)
            self._queue.put(_Job(fn, handle, time.perf_counter(),  # type: ignore[arg-type]
                                 exclusive=exclusive))
        return handle

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread between two rounds and return its result (see
        the module docstring); call from the event loop's thread. A caller that stops
        waiting before it ran skips it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._stopping:
                raise WorkerStoppedError("the worker is shutting down")
            self._queue.put(_Call(fn, future, loop))
        return await future

    def _retry_after(self) -> int:
        recent = [r.wait_s + r.run_s for r in list(self.history)[-16:]]
        per_job = sum(recent) / len(recent) if recent else 1.0
        return max(1, math.ceil(per_job * max(1, self.waiting) / 2))

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel running and waiting jobs, then end the engine thread."""
        with self._lock:
            self._stopping = True
            active = list(self._active)
        for job in active:
            job.handle.cancel()
        with self._lock:
            while True:
                try:
                    queued = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(queued, _Call):
                    queued.settle(WorkerStoppedError("the worker is shutting down"), None)
                elif queued is not None:
                    self._pending -= 1
                    queued.handle.cancel()
                    queued.handle._post(_ERROR, WorkerStoppedError("the worker is shutting down"))
            self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the engine thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if not self._admit():
                while self._held:  # shutting down: what never started is refused,
                    job = self._held.popleft()
                    job.handle._post(_ERROR, WorkerStoppedError("the worker is shutting down"))
                    with self._lock:
                        self._pending -= 1
                for job in self._active:  # and what runs stops at its next token
                    job.handle.cancel()
                while self._active:
                    self._round()
                return
            self._round()

    def _admit(self) -> bool:
        """Move queued jobs in (waiting when nothing runs); False on the stop sentinel."""
        block = not self._active and not self._held
        while True:
            try:
                job = self._queue.get(block=block)
            except queue.Empty:
                break
            block = False
            if job is None:
                return False
            if isinstance(job, _Call):
                job.run()  # between rounds: no step of any job is in progress
                continue
            self._held.append(job)
        while self._held and len(self._active) < self.max_running:
            job = self._held[0]
            if self._active and (job.exclusive or any(j.exclusive for j in self._active)):
                break  # an exclusive job runs alone
            self._held.popleft()
            self._start(job)
        return True

    def _start(self, job: _Job[object]) -> None:
        job.started = time.perf_counter()
        if job.handle.cancelled:
            job.handle._post(_DONE, None)
            self._record(job, None)
            return
        job.gen = iter(job.fn(job.handle.cancel_event))
        with self._lock:
            self._active.append(job)

    def _round(self) -> None:
        """One item from every running job, most urgent first."""
        for job in sorted(self._active, key=lambda j: (_RANK[j.handle.priority], j.queued_at)):
            assert job.gen is not None
            handle = job.handle
            try:
                item = next(job.gen)
            except StopIteration:
                handle._post(_DONE, None)
                self._finish(job, None)
                continue
            except Exception as exc:
                handle._post(_ERROR, exc)
                self._finish(job, f"{type(exc).__name__}: {exc}")
                continue
            job.items += 1
            if handle.cancelled and getattr(item, "is_step", False):
                job.after_cancel += 1
            handle._post(_ITEM, item)

    def _finish(self, job: _Job[object], error: str | None) -> None:
        close = getattr(job.gen, "close", None)
        if close is not None:
            close()
        with self._lock:
            self._active.remove(job)
        self._record(job, error)

    def _record(self, job: _Job[object], error: str | None) -> None:
        with self._lock:
            self._pending -= 1
        handle, started, items, after_cancel = job.handle, job.started, job.items, job.after_cancel
        record = JobRecord(
            id=handle.id, priority=handle.priority, wait_s=started - job.queued_at,
            run_s=time.perf_counter() - started, items=items, steps_after_cancel=after_cancel,
            cancelled=handle.cancelled, error=error)
        self.history.append(record)
        if self.on_record is not None:
            try:
                self.on_record(record)
            except Exception:  # metrics must never take the engine thread down
                log.exception("recording job %s failed", handle.id)
