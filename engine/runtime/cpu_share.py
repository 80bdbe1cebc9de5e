"""Threads that follow what the CPU has free (Linux).

An operator run on ONNX Runtime's threads ends when its last task does. Beside other busy
programs the OS time-slices the engine's threads with theirs, and a step waits, operator
after operator, for a thread that is not running: on two cores beside one busy process a
two-thread decode ran at half its quiet speed, below the two thirds an even share of the
CPU would give. With one thread it runs on the core the other program leaves, and never
waits for a second.

:class:`CpuShare` watches, twice a second while a request runs, how many cores other
programs use (the machine's busy time from ``/proc/stat`` less this process's own,
``os.times``) and caps the engine kernels' short loops (a decode step's; engine/kernels,
``EngineKernelsSetThreads``) at the cores left free, never above the session's threads; at
0 the session's own threads run them. An idle engine does not look (a worker waiting for
its next request wakes for nothing); a request's first look covers the pause before it. A
prefill's long operators keep every thread (their tasks outlast a time slice), and so does
everything under a heavier load (:func:`cap_for`). A cap changes which thread computes a
task, never what it computes: every answer keeps its bits. ONNX Runtime's own
small operators keep the session's threads.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.kernels import KernelUse

#: Seconds between two looks at the CPU.
INTERVAL_S = 0.5
#: Weight of the newest look in the smoothed figure (the rest: the looks before).
SMOOTHING = 0.5
#: Cores counted free although this much of them is used (a desktop's background noise).
SLACK = 0.25


@dataclass(frozen=True)
class CpuTimes:
    """Seconds of CPU time: the whole machine's busy time and this process's own."""

    busy: float
    own: float
    at: float  # time.monotonic()


def read_times(stat: Path = Path("/proc/stat")) -> CpuTimes | None:
    """The machine's busy CPU seconds (every core: user, nice, system, irq, softirq,
    steal) and this process's (user + system, all its threads); None where /proc/stat
    cannot be read (not Linux)."""
    try:
        first = stat.read_text(encoding="ascii").split("\n", 1)[0].split()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if not first or first[0] != "cpu" or len(first) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    own = os.times()
    return CpuTimes(busy=(user + nice + system + irq + softirq + steal) / ticks,
                    own=own.user + own.system, at=time.monotonic())


def others_cores(before: CpuTimes, after: CpuTimes) -> float:
    """How many cores other programs kept busy between two readings."""
    wall = after.at - before.at
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def cap_for(others: float, threads: int, cores: int, capped: bool = False) -> int:
    """The kernels' thread cap with `others` cores taken of `cores`, for a session of
    `threads` threads: 0 (no cap) while the free cores hold every thread; the whole free
    cores where clearly more than one is free; 0 again where fewer are (under a heavier
    load the engine's threads, time-sliced with the others, get more of the CPU than fewer
    threads would: measured beside two and four busy processes on two cores, the cap made
    decode slower). `capped`: a cap is on now; it stays while about one core is free (with
    the cap on, the others get more of the CPU and seem busier: without this margin the cap
    would come and go)."""
    free = cores - others
    if threads <= 1 or free >= threads - SLACK:
        return 0
    if free < (1 - 3 * SLACK / 5 if capped else 1 + 3 * SLACK / 5):
        return 0
    cap = max(1, math.floor(free + SLACK))
    return 0 if cap >= threads else cap


def usable_cores() -> int:
    """The logical CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def library_setter(library: Path) -> Callable[[int], None] | None:
    """`EngineKernelsSetThreads` of the kernels' library ONNX Runtime loaded (the same
    file: the process shares one copy); None for a build without it."""
    try:
        lib = ctypes.CDLL(str(library))
        setter = lib.EngineKernelsSetThreads
    except (OSError, AttributeError):
        return None
    setter.argtypes = [ctypes.c_int]
    setter.restype = None
    return setter


_SHARED: CpuShare | None = None
_SHARED_LOCK = threading.Lock()


class CpuShare:
    """Looks at the CPU every ``interval_s`` on a daemon thread while a request runs
    (:meth:`begin` / :meth:`end`) and sets the kernels' cap (``set_cap``) to what
    :func:`cap_for` says; :meth:`stop` ends it and lifts the cap."""

    def __init__(self, threads: int, set_cap: Callable[[int], None], cores: int | None = None,
                 interval_s: float = INTERVAL_S,
                 read: Callable[[], CpuTimes | None] = read_times) -> None:
        self.threads = threads
        self.cores = cores or usable_cores()
        self.cap = 0
        #: Cores other programs used, smoothed (None before the second look).
        self.others: float | None = None
        self._set = set_cap
        self._read = read
        self._interval = interval_s
        self._last = read()
        self._busy = 0  # requests running (every engine of the process)
        self._lock = threading.Lock()
        self._running = threading.Event()  # set while a request runs, or once stopped
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-share", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """A request starts: look now if the last look is old (the cap for its first steps
        then covers the pause before it), then every ``interval_s`` until the last ends."""
        with self._lock:
            self._busy += 1
            self._look()
            self._running.set()

    def end(self) -> None:
        with self._lock:
            self._busy = max(0, self._busy - 1)
            if not self._busy and not self._stopped.is_set():
                self._running.clear()

    def _look(self) -> None:
        """Read the CPU and update the cap, unless the last look is under half
        ``interval_s`` old (a shorter span says little: the kernel counts CPU time in
        ticks). Under ``_lock``."""
        if self._last is None or self._stopped.is_set():
            return
        now = self._read()
        if now is None:  # the CPU can no longer be read: keep the cap as it is
            self._last = None
            return
        if now.at - self._last.at < self._interval / 2:
            return
        seen = others_cores(self._last, now)
        self._last = now
        self.others = seen if self.others is None else \
            SMOOTHING * seen + (1 - SMOOTHING) * self.others
        cap = cap_for(self.others, self.threads, self.cores, capped=self.cap > 0)
        if cap != self.cap:
            self.cap = cap
            self._set(cap)

    def _run(self) -> None:
        while self._running.wait() and not self._stopped.wait(self._interval):
            with self._lock:
                if self._last is None:
                    return
                if self._busy:
                    self._look()

    def stop(self) -> None:
        """No more looks; the session's threads run the kernels again (the process's
        watcher: the next engine starts another). Idempotent."""
        global _SHARED
        self._stopped.set()
        self._running.set()
        self._thread.join(timeout=5)
        with self._lock:
            if self.cap:
                self.cap = 0
                self._set(0)
        with _SHARED_LOCK:
            if _SHARED is self:
                _SHARED = None

    def as_dict(self) -> dict[str, object]:
        return {"threads": self.threads, "cores": self.cores,
                "kernel_threads": self.cap or self.threads,
                "others_cores": None if self.others is None else round(self.others, 2)}


def shared(threads: int, library: Path) -> CpuShare | None:
    """The process's one watcher (every engine's kernels share one library and its cap),
    started by the first engine that asks; its threads are the most any engine asked for.
    None where the library cannot take a cap (an older build) or the CPU cannot be read."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            setter = library_setter(library)
            if setter is None or read_times() is None:
                return None
            _SHARED = CpuShare(threads, setter)
        else:
            _SHARED.threads = max(_SHARED.threads, threads)
        return _SHARED


def for_engine(config: EngineConfig, provider: str, use: KernelUse | None,
               threads: int) -> CpuShare | None:
    """The watcher for an engine whose kernels run on the CPU, where its config asks for
    one (EngineConfig.adaptive_threads); None otherwise."""
    if not config.adaptive_threads or provider != "cpu" or use is None or not use.status.ready \
            or use.status.library is None or not (use.moved or use.matmul_moved):
        return None
    return shared(threads, Path(use.status.library))
