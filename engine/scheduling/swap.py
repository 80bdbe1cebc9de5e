"""Swapping a request out and back in: the scheduler's tickets and what preemption does
to their KV. A preempted run's KV is copied to pages (`park`); when it runs again it is
copied back onto a runner (`resume`), from the pages, else from the tiered store, else
recomputed from the kept tokens, so its output is the same as if it had run alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from engine.api import GenerateEvent, GenerateRequest
from engine.generation.request import RequestRun
from engine.kv.cache import NoRoomError, PageTable, append_rows, read_rows, truncate_table
from engine.runtime.runner import DecodeRunner
from engine.scheduling.core import EngineCore, Preemptor
from engine.scheduling.pressure import make_room

Priority = Literal["low", "normal", "high"]
_RANK: dict[str, int] = {"high": 0, "normal": 1, "low": 2}

#: Receives a ticket's events, then its result event; or the error that ended it.
Sink = Callable[[GenerateEvent | BaseException], None]


@dataclass(eq=False)
class Ticket:
    id: int
    request: GenerateRequest
    priority: Priority
    session_id: int | None
    cancel: threading.Event
    sink: Sink
    submitted: float
    run: RequestRun | None = None
    #: KV of a preempted run, parked in pages until it resumes.
    parked: PageTable | None = None
    preemptions: int = 0
    #: Oldest prompt tokens dropped to fit the context (truncate_prompt).
    dropped: int = 0
    done: bool = False
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def rank(self) -> tuple[int, float]:
        return (_RANK[self.priority], self.submitted)


def park(engine: EngineCore, ticket: Ticket, release: Callable[[], None] | None) -> None:
    """Swap a running request's KV out: to pages, its runner left free. Under memory
    pressure (`release` frees the runner's buffers first) complete chunks also go to the
    tiered store; without room for pages the KV comes back from the store or is
    recomputed from the kept tokens."""
    run = ticket.run
    assert run is not None
    runner = run.runner
    # a sliding window past its first drop: the sinks' rows; resuming recomputes the rest,
    # which drops the same tokens again (engine.kv.window)
    rows = runner.export_kv(0, runner.exact_length)
    ticket.extra["parked_tokens"] = list(runner.tokens)
    if release is not None:
        engine.reuse.store(runner)
        runner.reset()
        release()
    table = PageTable()
    try:
        append_rows(engine.pool, table, rows, engine.prefix_cache)
        ticket.parked = table
    except NoRoomError:
        truncate_table(engine.pool, table, 0, engine.prefix_cache)
        ticket.parked = None  # resumes from the tiered store or by recomputing


def resume(engine: EngineCore, scheduler: Preemptor, ticket: Ticket, runner: DecodeRunner,
           *, others_running: bool) -> None:
    """Bring a preempted run back on `runner`. While others run, it waits (raises
    ResourceLimitError) until its KV fits the budget; alone, it always resumes."""
    run = ticket.run
    assert run is not None
    tokens: list[int] = ticket.extra["parked_tokens"]  # type: ignore[assignment]
    total = max(len(tokens), run.sequence.reserved)
    runner.reset()
    if not make_room(engine, scheduler, runner, total):
        if others_running:  # wait for room
            raise engine.governor.no_room_error(engine.governor.kv_tier,
                                                runner.growth_bytes(total))
        release_parked(engine, ticket)  # alone: it runs, its own pages go first
    del ticket.extra["parked_tokens"]
    runner.reserve(total)
    at = 0
    if ticket.parked is not None and ticket.parked.length:
        at = ticket.parked.length
        runner.import_kv(read_rows(engine.pool, ticket.parked, 0, at), 0, tokens[:at])
    elif engine.kv_tiers is not None and tokens:
        keys = engine.kv_tiers.available(tokens, len(tokens))
        at = engine.kv_tiers.fetch_into(runner, tokens, keys, 0)
    release_parked(engine, ticket)
    if at < len(tokens):
        runner.forward(np.asarray(tokens[at:], dtype=np.int64))
    run.runner = runner
    run.sequence.runner = runner


def release_parked(engine: EngineCore, ticket: Ticket) -> None:
    """Give a parked run's pages back (it resumes from the tiered store or by
    recomputing its kept tokens)."""
    if ticket.parked is not None:
        truncate_table(engine.pool, ticket.parked, 0, engine.prefix_cache)
        ticket.parked = None
