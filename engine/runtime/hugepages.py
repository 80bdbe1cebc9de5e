"""Back the model's weights with transparent huge pages (Linux).

Decode reads every weight once per token, so on the CPU it is bound by memory bandwidth and
by address translation: 4 KiB pages need one TLB entry per 4 KiB of weights, 2 MiB pages one
per 2 MiB. Most desktop Linux kernels ship transparent huge pages in ``madvise`` mode: only
memory a program marks gets them, and neither ONNX Runtime nor glibc's allocator marks
anything. After a model is loaded (ONNX Runtime has read and pre-packed its weights into
anonymous memory), :func:`advise_huge_pages` walks ``/proc/self/smaps`` and asks the
kernel to collapse the large, mostly resident anonymous regions into 2 MiB pages now
(``MADV_COLLAPSE``, Linux 6.1+), or marks them ``MADV_HUGEPAGE`` for ``khugepaged`` where
it cannot. The engine runs it on a background thread after a load, in the pauses between
requests (the model is usable at once). Nothing changes numerically.

Memory is never marked ``MADV_HUGEPAGE`` before it is touched: with the kernel's usual
``defrag=madvise`` every fault in such memory may enter direct compaction. Measured in
bench.peers on a quiet machine, glibc's ``glibc.malloc.hugetlb=1`` tunable (which marks
every allocation) made the load 905 vs 588 ms and the first request after it 836 vs 544 ms,
and KV buffers mapped so made the first request 805 vs 571 ms; the collapse afterwards, in
the pauses between requests, costs a request nothing.

Measured in ``bench/README.md`` (decode tok/s with and without).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
HUGE_PAGE = 2 * 1024 * 1024
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ (\d+)\s*(.*)$")


@dataclass(frozen=True)
class HugePageReport:
    """What :func:`advise_huge_pages` did: ``skipped`` says why it did nothing."""

    mode: str  # the kernel's THP mode: always / madvise / never / unknown
    regions: int = 0  # regions collapsed or marked MADV_HUGEPAGE
    advised_bytes: int = 0
    collapsed_regions: int = 0  # regions MADV_COLLAPSE succeeded on
    huge_bytes_before: int = 0  # AnonHugePages of the process before and after
    huge_bytes_after: int = 0
    seconds: float = 0.0
    skipped: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "regions": self.regions,
                "advised_mib": round(self.advised_bytes / 2**20, 1),
                "collapsed_regions": self.collapsed_regions,
                "huge_mib_before": round(self.huge_bytes_before / 2**20, 1),
                "huge_mib_after": round(self.huge_bytes_after / 2**20, 1),
                "seconds": round(self.seconds, 3), "skipped": self.skipped}


def thp_mode(path: Path = THP_MODE_FILE) -> str:
    """The bracketed word of ``/sys/kernel/mm/transparent_hugepage/enabled``."""
    try:
        text = path.read_text()
    except OSError:
        return "unknown"
    found = re.search(r"\[(\w+)\]", text)
    return found.group(1) if found else "unknown"


def anonymous_regions(maps_text: str, min_bytes: int,
                      min_resident: float = 0.0) -> list[tuple[int, int]]:
    """(start, length) of the private, writable, anonymous mappings of at least
    ``min_bytes``, trimmed inward to huge-page boundaries (what can be collapsed).
    ``maps_text`` is ``/proc/PID/maps`` or ``smaps``; with ``smaps`` a mapping must also be
    at least ``min_resident`` resident (``Rss``): collapsing fills a sparse mapping's
    holes, so a mostly empty allocator arena would grow the process for nothing; a mapping
    already (almost) all on huge pages is left out."""
    mappings: list[tuple[int, int, str, int, str]] = []
    resident: dict[int, int] = {}  # mapping index -> Rss bytes (smaps only)
    huge: dict[int, int] = {}  # mapping index -> AnonHugePages bytes (smaps only)
    for line in maps_text.splitlines():
        m = _MAPS_LINE.match(line)
        if m is not None:
            mappings.append((int(m.group(1), 16), int(m.group(2), 16), m.group(3),
                             int(m.group(4)), m.group(5).strip()))
        elif line.startswith("Rss:") and mappings:
            resident[len(mappings) - 1] = int(line.split()[1]) * 1024
        elif line.startswith("AnonHugePages:") and mappings:
            huge[len(mappings) - 1] = int(line.split()[1]) * 1024
    regions = []
    for index, (start, end, perms, inode, name) in enumerate(mappings):
        if inode != 0 or perms[:2] != "rw" or perms[3] != "p":
            continue  # file-backed, read-only or shared
        if name and name != "[heap]":
            continue  # [stack], [vvar], named anonymous memory: not ours to touch
        if resident.get(index, end - start) < min_resident * (end - start):
            continue
        lo = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
        hi = end // HUGE_PAGE * HUGE_PAGE
        if huge.get(index, 0) >= 0.9 * (hi - lo):
            continue  # on huge pages already (glibc's hugetlb tunable, or THP "always")
        if end - start >= min_bytes and hi - lo >= HUGE_PAGE:
            regions.append((lo, hi - lo))
    return regions


def anon_huge_bytes() -> int:
    """This process's ``AnonHugePages`` (bytes), 0 when unreadable."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


#: The collapse works in slices of this many bytes (one huge page), so a request that
#: starts meanwhile shares the cores with at most one slice's copy, not a whole region's.
SLICE = HUGE_PAGE


def advise_huge_pages(min_bytes: int = 8 * 1024 * 1024, min_resident: float = 0.75,
                      pause: Callable[[], None] | None = None) -> HugePageReport:
    """Move this process's large anonymous regions onto huge pages now (``MADV_COLLAPSE``);
    where the kernel cannot (before Linux 6.1, or no free huge page), mark them
    ``MADV_HUGEPAGE`` so ``khugepaged`` does it later. Regions that collapse keep their
    flags: memory ONNX Runtime maps there later still faults in 4 KiB pages (measured: the
    same decode gain as marking them too). Never raises: a kernel or platform that cannot
    do it gets a report saying so. ``pause`` is called before each slice (``SLICE``): it
    may block while the engine is busy."""
    if not sys.platform.startswith("linux"):
        return HugePageReport(mode="unknown", skipped="not Linux")
    mode = thp_mode()
    if mode == "never":
        return HugePageReport(mode=mode, skipped="transparent huge pages are off (never)")
    if mode == "unknown":
        return HugePageReport(mode=mode, skipped="no transparent huge page support")
    if pause is not None:
        pause()  # (reading smaps walks every page table too)
    began = time.perf_counter()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        maps = Path("/proc/self/smaps").read_text()
    except (OSError, AttributeError) as exc:
        return HugePageReport(mode=mode, skipped=f"cannot call madvise: {exc}")
    before = anon_huge_bytes()
    regions = advised = collapsed = 0
    resident = _resident_share(libc)
    for start, length in anonymous_regions(maps, min_bytes, min_resident):
        done, left = True, 0
        for lo in range(start, start + length, SLICE):
            if pause is not None:
                pause()
            size = min(SLICE, start + length - lo)
            # smaps was read before the pauses: the allocator may have handed part of this
            # slice back since (the app's "Free" trims the heap), and a collapse fills
            # every hole, so it would take back what was just freed
            if resident(lo, size) < min_resident:
                left += size
                continue
            done = madvise(lo, size, MADV_COLLAPSE) == 0 and done
        if left == length:
            continue  # all of it sparse by now: left alone, and not reported
        if done:
            collapsed += 1
        elif madvise(start, length, MADV_HUGEPAGE) != 0:
            continue  # unmapped meanwhile, or refused: leave it
        regions += 1
        advised += length
    report = HugePageReport(mode=mode, regions=regions, advised_bytes=advised,
                            collapsed_regions=collapsed, huge_bytes_before=before,
                            huge_bytes_after=anon_huge_bytes(),
                            seconds=time.perf_counter() - began)
    log.debug("huge pages: %s", report.as_dict())
    return report


def _resident_share(libc: ctypes.CDLL) -> Callable[[int, int], float]:
    """``share(address, length)``: the fraction of those pages now resident (``mincore``);
    1.0 where it cannot tell (the check then only costs nothing)."""
    mincore = getattr(libc, "mincore", None)
    if mincore is None:
        return lambda address, length: 1.0
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    mincore.restype = ctypes.c_int
    page = mmap.PAGESIZE

    def share(address: int, length: int) -> float:
        pages = -(-length // page)
        vector = ctypes.create_string_buffer(pages)
        if mincore(address, length, vector) != 0:
            return 1.0  # unmapped meanwhile: the collapse fails on its own
        return sum(byte & 1 for byte in vector.raw) / pages

    return share


class _Stopped(Exception):
    """Raised by the pause of a collapse that was stopped (its engine closed)."""


class BackgroundAdvice:
    """:func:`advise_huge_pages` on a daemon thread, once the engine is quiet: the engine
    serves at once while the kernel copies the weights into huge pages later.

    The collapse starts when the first request ends, after ``delay_s`` with none, or
    when someone waits for it (:meth:`wait`); the engine calls :meth:`begin` and
    :meth:`end` around each request, and each slice waits until no request has run for
    ``quiet_s``. Started at once after the load, on two cores, it made the first request
    after a load (an app's first answer) slower than with no huge pages at all
    (bench.peers, "first"); resumed the moment a request ended, it overlapped the next
    one: an editor's completions, one per keystroke, took 25-45 ms instead of 11-14 while
    it ran (a slice started in every gap between them). Now it works in the pauses of a
    session. It never waits more than ``patience_s`` in all (requests that never stop
    cannot keep the pages small forever).
    """

    def __init__(self, delay_s: float = 2.0, patience_s: float = 60.0,
                 quiet_s: float = 0.5) -> None:
        self.report: HugePageReport | None = None  # None until done
        self._busy = 0
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._go = threading.Event()
        self._delay = delay_s
        self._patience = patience_s
        self._quiet = quiet_s
        self._last_end = float("-inf")
        self._deadline = float("inf")
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="hugepages", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """A request starts: the collapse pauses after its current slice."""
        with self._lock:
            self._busy += 1
            self._idle.clear()

    def end(self) -> None:
        with self._lock:
            self._busy = max(0, self._busy - 1)
            self._last_end = time.monotonic()
            if not self._busy:
                self._idle.set()
        self._go.set()

    def stop(self) -> None:
        """No more slices (the engine closed: another engine's requests would not pause
        it); a slice under way finishes. Idempotent."""
        self._stopped = True
        self._idle.set()
        self._go.set()

    def _pause(self) -> None:
        """Return once no request has run for ``quiet_s`` (or patience ran out); raise
        when stopped."""
        while not self._stopped:
            left = self._deadline - time.monotonic()
            if left <= 0 or not self._idle.wait(None if left == float("inf") else left):
                break
            quiet_for = time.monotonic() - self._last_end
            if quiet_for >= self._quiet:
                break
            time.sleep(min(self._quiet - quiet_for, left))
        if self._stopped:
            raise _Stopped

    def _run(self) -> None:
        self._go.wait(self._delay)
        self._deadline = min(self._deadline, time.monotonic() + self._patience)
        with contextlib.suppress(_Stopped):  # stopped: no report, nothing more advised
            self.report = advise_huge_pages(pause=self._pause)

    def wait(self, timeout: float | None = None) -> bool:
        """Start it now, without waiting for quiet, and return True when done (within
        ``timeout`` seconds)."""
        self._deadline = time.monotonic()  # whoever waits wants it done, not paced
        self._go.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()
