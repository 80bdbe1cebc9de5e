"""Transparent huge pages for the loaded weights: which mappings qualify, the kernel's mode,
and the advice on this process (a real madvise on real memory)."""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
import time
from pathlib import Path

import pytest

import engine.runtime.hugepages as hugepages
from engine import Engine, EngineConfig
from engine.runtime.hugepages import (
    HUGE_PAGE,
    SLICE,
    BackgroundAdvice,
    advise_huge_pages,
    anon_huge_bytes,
    anonymous_regions,
    thp_mode,
)

MIB = 1024 * 1024
MAPS = """\
55d0a0000000-55d0a0021000 r--p 00000000 fd:01 1234 /usr/bin/python3.11
55d0a1000000-55d0a5000000 rw-p 00000000 00:00 0          [heap]
7f0000100000-7f0004300000 rw-p 00000000 00:00 0
7f1000000000-7f1004000000 rw-s 00000000 00:01 77         /dev/zero (deleted)
7f2000000000-7f2004000000 r--p 00000000 fd:01 99         /models/model.onnx.data
7f3000000000-7f3000400000 rw-p 00000000 00:00 0
7f4000000000-7f4004000000 rw-p 00000000 00:00 0          [stack]
7f5000000000-7f5004000000 ---p 00000000 00:00 0
"""


def test_only_large_private_writable_anonymous_mappings_qualify_trimmed_to_huge_pages() -> None:
    regions = anonymous_regions(MAPS, 8 * MIB)
    # the heap (64 MiB) and the unnamed 66 MiB mapping, trimmed inward to 2 MiB boundaries;
    # not the binary, the shared or file-backed mappings, the 4 MiB one, the stack or a
    # guard region
    assert regions == [(0x55D0A1000000, 64 * MIB), (0x7F0000200000, 64 * MIB)]
    assert all(start % HUGE_PAGE == 0 and length % HUGE_PAGE == 0 for start, length in regions)
    assert anonymous_regions(MAPS, 128 * MIB) == []


def test_with_smaps_a_mostly_empty_mapping_is_left_alone() -> None:
    smaps = """\
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:               65000 kB
7f1000000000-7f1004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:                4096 kB
"""
    # collapsing the second would make 60 MiB of untouched memory resident
    assert anonymous_regions(smaps, 8 * MIB, min_resident=0.75) == [(0x7F0000000000, 64 * MIB)]
    assert len(anonymous_regions(smaps, 8 * MIB)) == 2


def test_a_mapping_already_on_huge_pages_is_left_alone() -> None:
    # (a kernel in THP "always" mode, or khugepaged, got there first)
    smaps = """\
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:               65536 kB
AnonHugePages:     63488 kB
7f1000000000-7f1004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:               65536 kB
AnonHugePages:      4096 kB
"""
    assert anonymous_regions(smaps, 8 * MIB) == [(0x7F1000000000, 64 * MIB)]


def _fresh_buffer(collapsible: bool = True) -> mmap.mmap:
    """64 MiB of private anonymous memory, touched (resident on 4 KiB pages), in a mapping
    of its own: never advised before (malloc could hand out heap an earlier test's
    engine already put on huge pages, and the advice skips what is huge already). Not
    `collapsible`: left MADV_NOHUGEPAGE, so nothing else collapses it meanwhile (an
    earlier test's engine collapsing in the background, or khugepaged); the advice then
    finds it small, fails to collapse it, and marks it for khugepaged instead."""
    buffer = mmap.mmap(-1, 64 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # faulted in on 4 KiB pages whatever the kernel's defaults (some fault fresh memory in
    # on 2 MiB pages where it lands on a huge-page boundary)
    buffer.madvise(mmap.MADV_NOHUGEPAGE)
    buffer[:: 4096] = b"x" * len(buffer[:: 4096])
    if collapsible:
        buffer.madvise(mmap.MADV_HUGEPAGE)
    return buffer


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_advice_on_this_process_backs_a_large_buffer_with_huge_pages() -> None:
    buffer = _fresh_buffer()
    before = anon_huge_bytes()
    report = advise_huge_pages(min_bytes=32 * MIB)
    if thp_mode() in ("never", "unknown"):
        assert report.skipped and report.regions == 0
        return
    assert report.skipped is None
    assert report.regions >= 1 and report.advised_bytes >= 60 * MIB
    if report.collapsed_regions == report.regions:
        # MADV_COLLAPSE (Linux 6.1+) worked on every region, this buffer's too: resident on
        # huge pages now. (On a loaded machine the kernel may find no free huge page for
        # some region; that region is then only marked for khugepaged.)
        assert anon_huge_bytes() >= before + 60 * MIB
    assert bytes(buffer[:: 4096]) == b"x" * len(buffer[:: 4096])  # contents untouched
    assert report.as_dict()["advised_mib"] == round(report.advised_bytes / MIB, 1)


def test_the_engine_reports_what_it_did_and_can_be_told_not_to(genai_model_dir: Path) -> None:
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    try:
        assert engine.wait_huge_pages(timeout=30)  # it runs in the background after a load
        described = engine.describe()["huge_pages"]
        if sys.platform.startswith("linux"):
            assert isinstance(described, dict) and described["mode"] == thp_mode()
    finally:
        engine.close()
    off = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1, huge_pages=False))
    try:
        assert off.wait_huge_pages(timeout=0)
        assert off.describe()["huge_pages"] is None and off.huge_pages is None
    finally:
        off.close()


def _advise_only(buffer: mmap.mmap, monkeypatch: pytest.MonkeyPatch) -> int:
    """Make the advice's regions the 60 MiB of ``buffer`` from its first huge-page boundary
    alone (the walk of smaps is tested above), so what else the kernel (or an earlier
    test's engine) did to the process meanwhile cannot leave the advice nothing to slice;
    that boundary's offset in ``buffer``."""
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    monkeypatch.setattr(hugepages, "anonymous_regions",
                        lambda *args, **kwargs: [(start, 60 * MIB)])
    return start - address


def test_the_collapse_waits_between_slices_while_a_request_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine pauses the background collapse while a request runs (a first request
    # right after a load would share two cores with the kernel's copying otherwise).
    if thp_mode() in ("never", "unknown"):
        pytest.skip("no transparent huge pages on this kernel")
    buffer = _fresh_buffer(collapsible=False)
    _advise_only(buffer, monkeypatch)
    gate, reached = threading.Event(), threading.Event()
    slices = []

    def pause() -> None:
        slices.append(1)
        reached.set()
        gate.wait(30)

    reports = []
    worker = threading.Thread(target=lambda: reports.append(
        advise_huge_pages(min_bytes=32 * MIB, pause=pause)))
    worker.start()
    assert reached.wait(30)
    time.sleep(0.2)  # (it would go on, were it not waiting)
    assert slices == [1] and not reports  # stopped before its first slice
    gate.set()
    worker.join(30)
    assert reports and reports[0].regions >= 1
    assert len(slices) >= 60 * MIB // SLICE  # one pause per slice of the 64 MiB buffer
    assert bytes(buffer[:: 4096]) == b"x" * len(buffer[:: 4096])


def _resident(buffer: mmap.mmap, offset: int, length: int) -> int:
    """How many of those 4 KiB pages of ``buffer`` are resident now (``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    vector = ctypes.create_string_buffer(length // 4096)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer)) + offset
    assert libc.mincore(address, length, vector) == 0, ctypes.get_errno()
    return sum(byte & 1 for byte in vector.raw)


def test_memory_freed_while_the_collapse_waits_stays_freed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The collapse reads smaps once, then works slice by slice in the pauses between
    # requests; meanwhile "Free" may close kept chats and trim the heap. A collapse fills
    # every hole of its slice, so collapsing such a slice would take the freed memory back
    # (seen: the app's "Lowest" climbed by all that "Free" had freed).
    if thp_mode() in ("never", "unknown"):
        pytest.skip("no transparent huge pages on this kernel")
    buffer = _fresh_buffer()
    # the fourth slice: freed (but its first page) meanwhile
    freed = _advise_only(buffer, monkeypatch) + 3 * SLICE
    slices = []

    def pause() -> None:
        slices.append(1)
        if len(slices) == 5:  # the smaps walk's pause, then three slices: the fourth's turn
            buffer.madvise(mmap.MADV_DONTNEED, freed + 4096, SLICE - 4096)

    report = advise_huge_pages(min_bytes=32 * MIB, pause=pause)
    assert report.regions == 1
    assert _resident(buffer, freed, SLICE) == 1  # still freed: only its first page
    assert _resident(buffer, freed + SLICE, SLICE) == SLICE // 4096  # the next: untouched
    assert bytes(buffer[freed + SLICE:freed + 2 * SLICE:4096]) == b"x" * (SLICE // 4096)


def test_the_collapse_starts_when_the_first_request_ends_or_when_waited_for() -> None:
    # Left alone it would wait an hour for a quiet moment; a request's end starts it.
    after_request = BackgroundAdvice(delay_s=3600)
    after_request.begin()
    after_request.end()
    after_request._thread.join(30)
    assert after_request.report is not None
    waited = BackgroundAdvice(delay_s=3600)
    assert waited.wait(30) and waited.report is not None


def test_a_closed_engine_collapses_nothing_more(genai_model_dir: Path) -> None:
    # After a model switch the old engine's collapse would no longer pause for the new
    # engine's requests: closing it stops it (waiting then starts nothing).
    stopped = BackgroundAdvice(delay_s=3600)
    stopped.stop()
    assert stopped.wait(30) and stopped.report is None
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    engine.close()
    assert engine.wait_huge_pages(timeout=30) and engine.huge_pages is None


def test_the_collapse_waits_for_a_pause_in_the_requests_not_a_gap_between_two() -> None:
    # An editor asks for a completion at every keystroke: a slice started in each gap
    # between two requests overlapped the next one (25-45 ms instead of 11-14 per edit).
    advice = BackgroundAdvice(delay_s=3600, quiet_s=2.0)
    advice.begin()
    paused = threading.Event()

    def slice_waits() -> None:
        advice._pause()
        paused.set()

    waiter = threading.Thread(target=slice_waits, daemon=True)
    waiter.start()
    for _ in range(20):  # back-to-back requests
        advice.end()
        advice.begin()
    assert not paused.wait(0.5)  # a gap between two requests is no pause
    advice.end()
    assert paused.wait(30)  # a quiet moment is
    advice.wait(30)


def test_a_region_freed_whole_while_the_collapse_waits_is_not_reported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if thp_mode() in ("never", "unknown"):
        pytest.skip("no transparent huge pages on this kernel")
    buffer = _fresh_buffer()
    offset = _advise_only(buffer, monkeypatch)
    freed: list[int] = []

    def pause() -> None:  # the walk's pause: the whole buffer is handed back then
        if not freed:
            buffer.madvise(mmap.MADV_DONTNEED)
            freed.append(1)

    report = advise_huge_pages(min_bytes=32 * MIB, pause=pause)
    assert report.regions == 0 and report.collapsed_regions == 0
    assert _resident(buffer, offset, 60 * MIB) == 0
