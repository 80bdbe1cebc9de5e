"""The priority scheduler: which requests run, step by step, on the engine thread.

Requests arrive from any thread (`submit`) and are taken between steps. Each step runs
one prompt chunk of the most urgent request that is still prefilling and one decode step
for every request that is generating — as one batched ONNX Runtime run when the runners
share a KV bank (GroupQueryAttention graphs), else one after the other. A high-priority
request that is prefilling runs alone, so an editor's completion does not wait behind a
chat. When all runners are busy, a more urgent request preempts the least urgent one: its
KV is copied to pages (swap) and copied back when it resumes, so nothing is recomputed
and its output is the same as if it had run alone.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator

from engine.api import GenerateEvent, GenerateRequest, GenerateResult, Timings
from engine.errors import EngineError, InvalidOptionError, ResourceLimitError
from engine.generation.request import RequestRun
from engine.generation.stopping import FinishReason
from engine.kv.reuse import common_prefix_len
from engine.kv.sessions import Session
from engine.kv.shift import probe_hits
from engine.runtime.decode_gqa import SharedBufferRunner
from engine.scheduling.core import EngineCore
from engine.scheduling.pressure import relieve
from engine.scheduling.swap import _RANK, Sink, park, release_parked, resume
from engine.scheduling.swap import Priority as Priority
from engine.scheduling.swap import Ticket as Ticket

log = logging.getLogger(__name__)

class Scheduler:
    def __init__(self, engine: EngineCore) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue[Ticket] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self.waiting: list[Ticket] = []
        self.active: dict[int, Ticket] = {}  # runner index -> ticket
        self.preempted_total = 0
        self.batched_steps = 0
        self.waited_for_memory = 0
        self._wake = threading.Event()
        if engine.active_scheduler is None:  # a live limit change preempts its requests
            engine.active_scheduler = self

    # --- any thread ---------------------------------------------------------------------

    def submit(self, request: GenerateRequest, sink: Sink, *, priority: Priority = "normal",
               session_id: int | None = None,
               cancel: threading.Event | None = None) -> Ticket:
        if priority not in _RANK:
            raise InvalidOptionError("priority", f"expected low, normal or high, got "
                                     f"{priority!r}", hint="use 'high' for editor completions")
        ticket = Ticket(next(self._ids), request, priority, session_id,
                        cancel or threading.Event(), sink, time.perf_counter())
        self._inbox.put(ticket)
        self._wake.set()
        return ticket

    @classmethod
    def of(cls, engine: EngineCore) -> Scheduler:
        """The engine's scheduler (one per engine, created on first use)."""
        found = engine.active_scheduler
        return found if isinstance(found, Scheduler) else cls(engine)

    def stream(self, request: GenerateRequest, *, priority: Priority = "normal",
               session_id: int | None = None,
               cancel: threading.Event | None = None
               ) -> Generator[GenerateEvent, None, None]:
        """Submit and pull this request's events, stepping the scheduler as needed.

        Call on the engine thread. Several such streams consumed in turn run their
        requests together: each step advances (and batches) all of them, and events of
        the others wait in their own boxes.
        """
        box: deque[GenerateEvent | BaseException] = deque()
        ticket = self.submit(request, box.append, priority=priority, session_id=session_id,
                             cancel=cancel)
        try:
            while True:
                while not box:
                    if not self.step() and not box:
                        raise RuntimeError("the scheduler went idle before the request ended")
                item = box.popleft()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.result is not None:
                    return
        finally:
            if not ticket.done:
                ticket.cancel.set()  # the consumer left early: stop at the next step

    def run_forever(self, stop: threading.Event, idle_wait_s: float = 0.05) -> None:
        """The engine thread's loop."""
        while not stop.is_set():
            if not self.step():
                self._wake.wait(idle_wait_s)
                self._wake.clear()

    # --- engine thread ------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.active) or not self._inbox.empty()

    def step(self) -> bool:
        """One scheduling round; False when there was nothing to do."""
        while not self._inbox.empty():
            self.waiting.append(self._inbox.get())
        self._drop_cancelled()
        self._admit()
        if not self.active:
            return bool(self.waiting)
        prefilling = [t for t in self.active.values() if _run_of(t).sequence.prefilling]
        decoding = [t for t in self.active.values()
                    if t not in prefilling and not _run_of(t).finished]
        urgent = min(prefilling, key=lambda t: t.rank, default=None)
        if urgent is not None:
            self._advance(urgent)
        # an urgent prompt runs alone; otherwise everyone generating takes a step
        if decoding and (urgent is None or
                         _RANK[urgent.priority] >= min(_RANK[t.priority] for t in decoding)):
            self._decode(decoding)
        for index, ticket in list(self.active.items()):
            if ticket.run is not None and ticket.run.finished:
                self._complete(index, ticket)
        relieve(self.engine, self)  # a lone request that ran over the limit has ended
        return True

    def _advance(self, ticket: Ticket) -> None:
        """Run one step of one request alone."""
        assert ticket.run is not None
        try:
            events = ticket.run.advance()
        except Exception as exc:
            self._fail(ticket, exc)
            return
        for event in events:
            ticket.sink(event)

    def _decode(self, tickets: list[Ticket]) -> None:
        runs = [_run_of(t) for t in tickets]
        rows = [r.runner for r in runs if isinstance(r.runner, SharedBufferRunner)]
        batched = len(rows) == len(runs) > 1 and all(r.sequence.batchable for r in runs)
        if not batched:
            for ticket in tickets:
                self._advance(ticket)
            return
        try:
            pending = [r.sequence.pending for r in runs]
            logits = rows[0].bank.forward_batch(rows, [p for p in pending if p is not None])
        except Exception as exc:  # an ORT failure ends every request of the batch
            for ticket in tickets:
                self._fail(ticket, exc)
            return
        self.batched_steps += 1
        for ticket, run, row in zip(tickets, runs, logits, strict=True):
            try:  # a request's own sampler may fail: that request ends, the others go on
                event = run.on_step(run.sequence.accept(row))
            except Exception as exc:
                self._fail(ticket, exc)
                continue
            if event is not None:
                ticket.sink(event)

    def _fail(self, ticket: Ticket, exc: BaseException) -> None:
        if ticket.done:
            return
        ticket.done = True
        if ticket.run is not None:
            self.engine.run_ended()
        index = next((i for i, t in self.active.items() if t is ticket), None)
        if index is not None:
            del self.active[index]
            self.engine.runners[index].reset()
        if not isinstance(exc, EngineError):
            log.error("request %d failed", ticket.id, exc_info=exc)
        ticket.sink(exc)

    def _complete(self, index: int, ticket: Ticket) -> None:
        run = ticket.run
        assert run is not None
        del self.active[index]
        ticket.done = True
        self.engine.end_run(run, self._session(ticket))
        try:
            events = run.closing_events()
        except EngineError as exc:  # a JSON-constrained value cut off by a limit
            ticket.sink(exc)
            return
        for event in events:
            ticket.sink(event)

    def _session(self, ticket: Ticket) -> Session | None:
        if ticket.session_id is None:
            return None
        return self.engine.sessions.get(ticket.session_id)

    def _drop_cancelled(self) -> None:
        for ticket in [t for t in self.waiting if t.cancel.is_set()]:
            self.waiting.remove(ticket)
            ticket.done = True
            run = ticket.run
            if run is None:  # never started: an empty, cancelled result
                ticket.sink(_cancelled_event(ticket))
                continue
            # preempted, then cancelled: its runner serves others now; keep the history
            session = self._session(ticket)
            if session is not None:
                session.tokens = run.prompt + run.sampled
            release_parked(self.engine, ticket)
            for event in run.closing_events():
                ticket.sink(event)

    # --- admission and preemption -----------------------------------------------------

    def _free_runner(self, prompt: list[int]) -> int | None:
        """A free runner index, preferring the one whose cache shares most of `prompt`."""
        free = [i for i in range(len(self.engine.runners)) if i not in self.active]
        if free:
            shared = {i: common_prefix_len(self.engine.runners[i].tokens, prompt, len(prompt))
                      for i in free}
            shifter = self.engine.reuse.shifter
            if shifter is None:
                return max(free, key=shared.__getitem__)
            # among runners sharing about as long a prefix, the one holding runs of the
            # prompt elsewhere (a moved window) can shift them (engine.kv.shift)
            best = max(shared.values())
            near = [i for i in free if shared[i] > best - shifter.min_run_for(len(prompt))]
            return max(near, key=lambda i: (probe_hits(self.engine.runners[i].tokens, prompt),
                                            shared[i]))
        if self.engine.add_runner() is not None:
            return len(self.engine.runners) - 1
        return None

    def _admit(self) -> None:
        busy_sessions = {t.session_id for t in self.active.values() if t.session_id}
        for ticket in sorted(self.waiting, key=lambda t: t.rank):
            if ticket.session_id is not None and ticket.session_id in busy_sessions:
                continue  # one turn of a session at a time
            prompt = self._prompt(ticket)
            if prompt is None:
                self.waiting.remove(ticket)
                continue
            index = self._free_runner(prompt)
            if index is None:
                victim = max(self.active.items(), key=lambda kv: kv[1].rank, default=None)
                if victim is None or victim[1].rank[0] <= ticket.rank[0]:
                    return  # nothing less urgent to preempt: wait
                index = victim[0]
                self._preempt(index, victim[1])
            self.waiting.remove(ticket)
            if self._start(ticket, index, prompt):
                self.active[index] = ticket
                if ticket.session_id is not None:
                    busy_sessions.add(ticket.session_id)

    def _prompt(self, ticket: Ticket) -> list[int] | None:
        """The ticket's full prompt (a resumed run: the tokens it had); None on bad input."""
        if ticket.run is not None:
            return list(ticket.extra["parked_tokens"])  # type: ignore[call-overload]
        try:
            prompt = self.engine.encode_request(ticket.request)
            session = self._session(ticket)
            if session is not None:
                prompt = session.tokens + prompt
            fitted = self.engine.fit_prompt(prompt, ticket.request.options, session is not None)
            ticket.dropped = len(prompt) - len(fitted)
            prompt = fitted
        except Exception as exc:
            ticket.done = True
            if not isinstance(exc, EngineError):
                log.error("request %d could not start", ticket.id, exc_info=exc)
            ticket.sink(exc)
            return None
        return prompt

    def _start(self, ticket: Ticket, index: int, prompt: list[int]) -> bool:
        runner = self.engine.runners[index]
        try:
            if ticket.run is not None:
                resume(self.engine, self, ticket, runner, others_running=bool(self.active))
            else:
                ticket.run = self.engine.start_run(
                    ticket.request, prompt, self._session(ticket), ticket.cancel,
                    ticket.submitted, runner, dropped=ticket.dropped)
        except ResourceLimitError as exc:
            if self.active:  # memory frees up as running requests finish: wait for it
                self.waiting.append(ticket)
                self.waited_for_memory += 1
                return False
            self._fail(ticket, exc)  # nothing running could free room: refuse, with numbers
            return False
        except Exception as exc:
            self._fail(ticket, exc)
            return False
        return True

    def _preempt(self, index: int, ticket: Ticket,
                 release: Callable[[], None] | None = None) -> None:
        """Swap a running request out: its KV goes to pages, its runner is freed. Under
        memory pressure (`release` frees the runner's buffers first) complete chunks also
        go to the tiered store; without room for pages the KV comes back from the store or
        is recomputed from the kept tokens."""
        assert ticket.run is not None
        del self.active[index]
        park(self.engine, ticket, release)
        ticket.preemptions += 1
        self.preempted_total += 1
        self.waiting.append(ticket)

    def preempt_for_memory(self, over: Callable[[], bool], release: Callable[[], None]) -> int:
        """Preempt running requests, least urgent (then newest) first, while `over()`;
        `release` frees the buffers a preempted request held. The most urgent running
        request is never preempted. Returns how many were preempted."""
        count = 0
        while len(self.active) > 1 and over():
            index, ticket = max(self.active.items(), key=lambda kv: kv[1].rank)
            self._preempt(index, ticket, release)
            count += 1
        return count

    def running(self) -> list[RequestRun]:
        """The requests that hold a runner now."""
        return [t.run for t in self.active.values() if t.run is not None]

    def release_parked_kv(self) -> int:
        """Release the pages of waiting preempted requests (they resume from the tiered
        store or by recomputing their kept tokens); returns how many were released."""
        parked = [t for t in self.waiting if t.parked is not None]
        for ticket in parked:
            release_parked(self.engine, ticket)
        return len(parked)


def _run_of(ticket: Ticket) -> RequestRun:
    assert ticket.run is not None, "an active ticket has a run"
    return ticket.run


def _cancelled_event(ticket: Ticket) -> GenerateEvent:
    now = time.perf_counter()
    result = GenerateResult(
        text="", token_ids=(), finish_reason=FinishReason("cancelled"), prompt_tokens=0,
        timings=Timings(0.0, 0.0, 0.0, (now - ticket.submitted) * 1e3))
    return GenerateEvent("", None, None, now, result=result)
