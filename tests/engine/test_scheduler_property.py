"""A seeded random stream of requests, sessions, cancellations and limit changes.

Over 500+ scheduler steps on a real engine: every request ends with a result or a
documented error, nothing waits forever, KV accounting stays consistent with what is
allocated, and every request that completed gives the same tokens as running alone.
"""

import random
import threading

import psutil

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.decode_gqa import SharedBufferRunner
from engine.errors import ContextOverflowError, ResourceLimitError
from engine.scheduler import Scheduler

MIB = 1024 * 1024
DOCUMENTED = (ResourceLimitError, ContextOverflowError)


class Box:
    def __init__(self):
        self.items = []

    def __call__(self, item):
        self.items.append(item)

    @property
    def done(self):
        return bool(self.items) and (isinstance(self.items[-1], BaseException)
                                     or self.items[-1].result is not None)


def _request(rng, max_new):
    prompt = tuple(rng.randrange(9, 400) for _ in range(rng.randrange(1, 40)))
    if rng.random() < 0.3:  # share a prefix with others now and then
        prompt = (5, 6, 7, 8, 9, 10, 11, 12) * 3 + prompt
    return GenerateRequest(token_ids=prompt, options=GenerateOptions(
        temperature=0.0, stop_on_eos=False, max_new_tokens=max_new))


def test_random_streams_complete_and_match_their_solo_runs(genai_model_dir):
    rng = random.Random(1234)
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1, max_batch=2,
                                                       kv_page_size=8))
    solo = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1, prefix_cache=False))
    scheduler = Scheduler(engine)
    tickets: list[tuple[GenerateRequest, Box, threading.Event, int | None]] = []
    sessions = [engine.create_session() for _ in range(2)]
    steps = 0
    while steps < 520 or scheduler.busy:
        roll = rng.random()
        if steps < 520 and roll < 0.08:
            session = rng.choice([None, None, *sessions])
            busy = {s for _, b, _, s in tickets if s is not None and not b.done}
            if session in busy:
                session = None
            request, box, cancel = _request(rng, rng.randrange(1, 30)), Box(), threading.Event()
            scheduler.submit(request, box, cancel=cancel, session_id=session,
                             priority=rng.choice(["low", "normal", "high"]))
            tickets.append((request, box, cancel, session))
        elif roll < 0.10 and tickets:
            rng.choice(tickets)[2].set()
        elif roll < 0.12:
            rss = psutil.Process().memory_info().rss
            engine.set_limit("host_ram", rng.choice(["auto", f"{rss // MIB + 64}MiB"]))
        scheduler.step()
        steps += 1
        banks = {id(r.bank): r.bank for r in engine.runners if isinstance(r, SharedBufferRunner)}
        assert engine.kv_bytes() == engine.pool.nbytes + sum(b.nbytes for b in banks.values())
        assert steps < 20000, "the scheduler did not drain"
    engine.set_limit("host_ram", "auto")
    assert len(tickets) >= 20
    completed = 0
    for request, box, cancel, session in tickets:
        assert box.done, "every request ends"
        last = box.items[-1]
        if isinstance(last, BaseException):
            assert isinstance(last, DOCUMENTED), last
            continue
        result = last.result
        if cancel.is_set() or session is not None:
            assert str(result.finish_reason) in ("cancelled", "max_tokens", "length")
            continue
        completed += 1
        solo.runner.reset()
        assert result.token_ids == solo.generate(request).token_ids
    assert completed >= 8
    assert scheduler.preempted_total > 0 and scheduler.batched_steps > 0
