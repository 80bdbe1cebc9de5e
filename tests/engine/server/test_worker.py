"""The engine thread and its queue, and the generation wrapper, without HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from engine import Engine, GenerateOptions, GenerateRequest
from engine.server.generation import Chunk, Final, IndentGate, Limits, run_generation
from engine.server.worker import EngineWorker, QueueFullError, WorkerStoppedError


def _run(coro):
    return asyncio.run(coro)


def _counting(n: int, log: list[str], name: str, delay: float = 0.0):
    def job(cancel: threading.Event) -> Iterator[int]:
        log.append(f"{name}:{threading.current_thread().name}")
        for i in range(n):
            if cancel.is_set():
                return
            time.sleep(delay)
            yield i

    return job


def test_jobs_run_in_order_on_the_engine_thread():
    worker = EngineWorker()
    worker.start()
    log: list[str] = []

    async def main() -> list[list[int]]:
        handles = [worker.submit(_counting(3, log, f"j{i}")) for i in range(3)]
        results = []
        for handle in handles:
            results.append([item async for item in handle])
        return results

    try:
        assert _run(main()) == [[0, 1, 2]] * 3
        assert log == ["j0:engine", "j1:engine", "j2:engine"]
    finally:
        worker.stop()


def test_a_job_cancelled_while_waiting_never_starts_and_errors_propagate():
    worker = EngineWorker()
    worker.start()
    log: list[str] = []

    def failing(cancel: threading.Event) -> Iterator[int]:
        yield 1
        raise ValueError("boom")

    async def main() -> None:
        blocker = worker.submit(_counting(200, log, "blocker", delay=0.005))
        waiting = worker.submit(_counting(3, log, "waiting"))
        waiting.cancel()
        assert await anext(blocker) == 0
        blocker.cancel()
        assert len([i async for i in blocker]) <= 2  # stops at its next check
        assert [i async for i in waiting] == []
        bad = worker.submit(failing)
        assert await anext(bad) == 1
        with pytest.raises(ValueError, match="boom"):
            await anext(bad)

    try:
        _run(main())
        assert log == ["blocker:engine"]
        # the engine thread records a job just after its last item reached the caller: wait
        # for the three records (on a busy machine the check could come first)
        deadline = time.monotonic() + 60
        while len(worker.history) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        records = {r.id: r for r in worker.history}  # jobs run together: ids, not order
        assert records[3].error == "ValueError: boom"
        assert records[1].cancelled and records[2].cancelled and records[2].items == 0
    finally:
        worker.stop()


def test_a_full_queue_refuses_with_retry_after_and_stop_cancels_waiting_jobs():
    worker = EngineWorker(max_queue=2)
    worker.start()

    async def main() -> None:
        gate = threading.Event()
        running = threading.Event()

        def blocking(cancel: threading.Event) -> Iterator[int]:
            running.set()
            gate.wait(5)
            yield 0

        first = worker.submit(blocking)
        # until the engine thread runs it (``waiting`` is 0 as soon as it is submitted,
        # before the engine thread took it off the queue: stop() would refuse it)
        while not running.is_set():
            await asyncio.sleep(0.001)
        queued = [worker.submit(blocking) for _ in range(2)]
        with pytest.raises(QueueFullError) as info:
            worker.submit(blocking)
        assert info.value.retry_after_s >= 1
        stopper = asyncio.get_running_loop().run_in_executor(None, worker.stop, 5.0)
        while not worker._stopping:  # stop() has begun (a fixed sleep loses under load)
            await asyncio.sleep(0.001)
        gate.set()
        await stopper
        assert [i async for i in first] == [0]
        for handle in queued:
            with pytest.raises(WorkerStoppedError):
                await anext(handle)
        with pytest.raises(WorkerStoppedError):
            worker.submit(blocking)

    _run(main())
    assert not worker.thread.is_alive()


def test_calls_run_on_the_engine_thread_between_rounds_even_when_jobs_fill_it():
    worker = EngineWorker(max_running=1)
    worker.start()
    log: list[str] = []

    async def main() -> None:
        running = worker.submit(_counting(10_000, log, "running", delay=0.002))
        waiting = worker.submit(_counting(1, log, "waiting"))
        assert await anext(running) == 0
        thread = await asyncio.wait_for(
            worker.call(lambda: threading.current_thread().name), 1.0)
        assert thread == "engine" and log == ["running:engine"]  # the queue did not move

        def broken() -> int:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            await worker.call(broken)
        running.cancel()
        assert [i async for i in waiting] == [0]
        stopper = asyncio.get_running_loop().run_in_executor(None, worker.stop, 5.0)
        await stopper
        with pytest.raises(WorkerStoppedError):
            await worker.call(lambda: 1)

    _run(main())


@pytest.mark.parametrize("pieces,n,expected,stopped", [
    (["def f():\n", "    return 1\n", "x = 2"], 4, "def f():\n    return 1\n", True),
    (["a\n  ", "  b\n\n", "    c"], 4, "a\n    b\n\n    c", False),
    (["a\n", "\tb"], 2, "a\n\t", True),  # like llama.cpp: cut at the first visible char
    (["first line is free\n", "   "], 4, "first line is free\n   ", False),
])
def test_indent_gate(pieces, n, expected, stopped):
    gate = IndentGate(n)
    out = "".join(gate.feed(p) for p in pieces) + gate.flush()
    assert out == expected and gate.stopped is stopped


def test_generation_wrapper_reports_limits_and_cancellation(engine: Engine):
    options = GenerateOptions(temperature=0.0, max_new_tokens=200, stop_on_eos=False)
    request = GenerateRequest(prompt="import os\n", options=options)
    cancel = threading.Event()
    items = list(run_generation(engine, request, cancel, Limits(predict_ms=1e-6)))
    final = items[-1]
    assert isinstance(final, Final) and final.limit == "t_max_predict_ms"
    assert final.stop == "limit" and final.text.endswith("\n")  # at the first line break
    assert final.text.count("\n") == 1 and final.completion_tokens < 200
    assert final.text == "".join(i.text for i in items if isinstance(i, Chunk))
    cancel = threading.Event()
    cancel.set()  # cancelled before the first prefill chunk: an empty, cancelled result
    items = list(run_generation(engine, request, cancel))
    assert isinstance(items[-1], Final) and items[-1].stop == "cancelled"
    assert items[-1].completion_tokens == 0
    again = list(run_generation(engine, request, threading.Event()))  # the engine is fine
    assert isinstance(again[-1], Final) and again[-1].completion_tokens == 200
