"""Threads that follow what the CPU has free (engine.runtime.cpu_share): when the kernels'
short loops are capped, how the cap follows other programs' use of the cores, and that a
cap never changes an answer (the built-in model's logits with the kernels' decode loops on
one thread, on two parts and uncapped)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine import Engine, EngineConfig, kernels
from engine.model.default_model import default_model_dir
from engine.runtime import cpu_share
from engine.runtime.cpu_share import CpuShare, CpuTimes, cap_for, others_cores, read_times

FOUND = default_model_dir()
MODEL = FOUND if FOUND is not None else Path("missing")


@pytest.mark.parametrize(("others", "capped", "cap"), [
    (0.0, False, 0),    # a quiet machine: both threads
    (0.2, False, 0),    # background noise
    (0.67, False, 1),   # one busy program beside two threads: one core is left
    (1.0, True, 1),     # ... and with the cap on it gets its whole core: the cap stays
    (1.0, False, 0),    # two busy programs beside two threads: two threads get more
    (1.33, True, 0),    # ... and a cap that was on comes off
    (1.6, False, 0),    # four busy programs: the same
])
def test_two_threads_on_two_cores_go_to_one_beside_one_busy_program(others, capped, cap):
    assert cap_for(others, threads=2, cores=2, capped=capped) == cap


def test_a_larger_machine_keeps_what_the_others_leave_free():
    assert cap_for(2.0, threads=4, cores=8) == 0          # six cores free for four threads
    assert cap_for(5.0, threads=4, cores=8) == 3          # three free
    assert cap_for(6.5, threads=4, cores=8) == 1          # one and a half free
    assert cap_for(7.5, threads=4, cores=8) == 0          # none: time-sliced, all threads
    assert cap_for(1.0, threads=1, cores=2) == 0          # one thread: nothing to cap


def test_others_are_the_machines_busy_time_less_this_process():
    before = CpuTimes(busy=100.0, own=10.0, at=50.0)
    after = CpuTimes(busy=103.0, own=11.0, at=52.0)       # 3 s busy in 2 s, 1 s of it ours
    assert others_cores(before, after) == pytest.approx(1.0)
    assert others_cores(after, after) == 0.0


def test_proc_stat_is_read_in_seconds(tmp_path: Path):
    ticks = __import__("os").sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  {ticks} 0 {ticks} 5000 7 0 0 {ticks} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    times = read_times(stat)
    assert times is not None and times.busy == pytest.approx(3.0)  # user, system, steal
    (tmp_path / "bad").write_text("intr 1 2 3\n")
    assert read_times(tmp_path / "bad") is None
    assert read_times(tmp_path / "missing") is None


def _readings(others: list[float], own_per_look: float = 0.5) -> Iterator[CpuTimes]:
    """Readings half a second apart in which other programs use `others[i]` cores."""
    busy = own = at = 0.0
    yield CpuTimes(busy, own, at)
    for cores in others:
        at += 0.5
        own += own_per_look
        busy += own_per_look + cores * 0.5
        yield CpuTimes(busy, own, at)
    while True:  # then a quiet machine
        at += 0.5
        own += own_per_look
        busy += own_per_look
        yield CpuTimes(busy, own, at)


def test_the_watcher_caps_beside_a_busy_program_and_lifts_the_cap_when_it_ends():
    caps: list[int] = []
    lifted, capped = threading.Event(), threading.Event()

    def set_cap(n: int) -> None:
        caps.append(n)
        (capped if n else lifted).set()

    readings = _readings([0.7, 0.7, 1.0, 1.0, 1.0, 1.0])
    share = CpuShare(threads=2, set_cap=set_cap, cores=2, interval_s=0.01,
                     read=lambda: next(readings))
    try:
        share.begin()  # a request runs (the watcher looks only then)
        assert capped.wait(60), "no cap beside a busy program"
        assert lifted.wait(60), "the cap stayed on a quiet machine"
        assert caps[:2] == [1, 0]
        assert share.as_dict()["kernel_threads"] == 2
    finally:
        share.stop()


def test_an_idle_watcher_does_not_look_and_a_request_looks_at_once():
    """Between requests the watcher sleeps (an idle worker wakes for nothing); a request's
    first look, made as it starts, covers the pause and sets the cap for its first steps."""
    looks: list[float] = []
    readings = _readings([0.7] * 50)

    def read() -> CpuTimes:
        looks.append(0)
        return next(readings)

    caps: list[int] = []
    share = CpuShare(threads=2, set_cap=caps.append, cores=2, interval_s=0.01, read=read)
    try:
        idle = threading.Event()
        idle.wait(0.3)  # thirty intervals with no request
        assert len(looks) == 1, "the watcher looked while no request ran"
        share.begin()
        assert len(looks) == 2 and caps == [1], "a request did not get a fresh cap at once"
        share.end()
        idle.wait(0.05)  # a look of the thread's may have been under way
        after_end = len(looks)
        idle.wait(0.3)
        assert len(looks) == after_end, "the watcher went on looking after the request"
    finally:
        share.stop()


@pytest.mark.skipif(kernels.library() is None, reason="the engine's kernels were not built")
@pytest.mark.skipif(FOUND is None, reason="no built-in model in this checkout")
def test_a_cap_changes_no_logit():
    library = kernels.library()
    assert library is not None
    lib = ctypes.CDLL(str(library))
    lib.EngineKernelsSetThreads.argtypes = [ctypes.c_int]
    lib.EngineKernelsThreads.restype = ctypes.c_int
    running = cpu_share._SHARED  # the process's watcher would set the cap meanwhile
    if running is not None:
        running.stop()
    engine = Engine.load(MODEL, EngineConfig(intra_op_threads=2, adaptive_threads=False))
    ids = np.random.default_rng(1).integers(100, 40000, size=40).astype(np.int64)
    seen = {}
    try:
        for cap in (0, 1, 2):
            lib.EngineKernelsSetThreads(cap)
            assert lib.EngineKernelsThreads() == cap
            engine.runner.reset()
            engine.runner.forward(ids[:30])  # a prefill chunk (never capped)
            steps = [engine.runner.forward(ids[i:i + 1]).copy() for i in range(30, 40)]
            seen[cap] = np.stack(steps)       # decode steps: the capped loops
    finally:
        lib.EngineKernelsSetThreads(0)
        engine.close()
    np.testing.assert_array_equal(seen[1], seen[0])
    np.testing.assert_array_equal(seen[2], seen[0])


@pytest.mark.skipif(kernels.library() is None, reason="the engine's kernels were not built")
@pytest.mark.skipif(FOUND is None, reason="no built-in model in this checkout")
def test_the_engine_says_how_many_threads_its_kernels_use():
    engine = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    try:
        described = engine.describe()["cpu_share"]
        if cpu_share.read_times() is None:  # not Linux
            assert described is None
        else:
            assert isinstance(described, dict)
            assert described["threads"] == 2 and described["kernel_threads"] in (1, 2)
    finally:
        engine.close()
    off = Engine.load(MODEL, EngineConfig(intra_op_threads=2, adaptive_threads=False))
    try:
        assert off.describe()["cpu_share"] is None
    finally:
        off.close()
