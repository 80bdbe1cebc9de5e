"""The scheduler interleaves, batches and preempts without changing any output (fp32; on
int4 graphs, up to a near-tie: tests/engine/equivalence.py)."""

import random
import threading

import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.errors import InvalidPromptError
from engine.scheduling.scheduler import Scheduler
from tests.engine.equivalence import assert_follows_solo_up_to_a_near_tie, exact_paths


class Collector:
    def __init__(self):
        self.events = []
        self.error = None

    def __call__(self, item):
        if isinstance(item, BaseException):
            self.error = item
        else:
            self.events.append(item)

    @property
    def result(self):
        return self.events[-1].result if self.events else None


def _req(ids, n=12, **kw):
    kw.setdefault("temperature", 0.0)
    return GenerateRequest(token_ids=tuple(ids), options=GenerateOptions(
        max_new_tokens=n, stop_on_eos=False, **kw))


def _drain(scheduler, limit=5000):
    for _ in range(limit):
        if not scheduler.step():
            return
    raise AssertionError("scheduler did not go idle")


PROMPTS = [[5, 17, 42], list(range(30, 52)), [300, 12, 8, 9], list(range(100, 140))]


@pytest.fixture(scope="module", params=["genai", "optimum"])
def engines(request, genai_model_dir, optimum_model_dir):
    folder = genai_model_dir if request.param == "genai" else optimum_model_dir
    solo = Engine.load(folder, EngineConfig(intra_op_threads=1, prefix_cache=False))
    return folder, solo


def _solo(solo, request):
    solo.runner.reset()
    return solo.generate(request).token_ids


def test_concurrent_requests_match_their_solo_runs(engines):
    folder, solo = engines
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1, max_batch=4))
    scheduler = Scheduler(engine)
    requests = [_req(PROMPTS[0]), _req(PROMPTS[1], temperature=1.3, seed=5),
                _req(PROMPTS[2], n=20, top_k=5, temperature=0.8, seed=9), _req(PROMPTS[3])]
    sinks = [Collector() for _ in requests]
    for req, sink in zip(requests, sinks, strict=True):
        scheduler.submit(req, sink)
    _drain(scheduler)
    for req, sink in zip(requests, sinks, strict=True):
        assert sink.error is None
        assert sink.result.token_ids == _solo(solo, req)
    if engine.decode_path == "shared_buffer":
        assert scheduler.batched_steps > 0
        assert len(engine.runners) == 4


def test_high_priority_preempts_and_everyone_matches_solo(engines):
    folder, solo = engines
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1, max_batch=2))
    scheduler = Scheduler(engine)
    low = [Collector(), Collector()]
    for ids, sink in zip(PROMPTS[:2], low, strict=True):
        scheduler.submit(_req(ids, n=30), sink, priority="low")
    for _ in range(6):
        scheduler.step()
    urgent = Collector()
    scheduler.submit(_req(PROMPTS[2], n=5), urgent, priority="high")
    steps_to_answer = 0
    while urgent.result is None:
        scheduler.step()
        steps_to_answer += 1
    assert scheduler.preempted_total == 1
    assert all(s.result is None for s in low)  # the urgent request finished first
    _drain(scheduler)
    assert urgent.result.token_ids == _solo(solo, _req(PROMPTS[2], n=5))
    for ids, sink in zip(PROMPTS[:2], low, strict=True):
        assert sink.result.token_ids == _solo(solo, _req(ids, n=30))


def test_requests_arriving_mid_generation_start_between_steps(engines):
    folder, _ = engines
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1))
    scheduler = Scheduler(engine)
    first, second = Collector(), Collector()
    scheduler.submit(_req(PROMPTS[1], n=40), first)
    for _ in range(5):
        scheduler.step()
    scheduler.submit(_req(PROMPTS[0], n=3), second)
    while second.result is None:
        scheduler.step()
    assert first.result is None  # the long request is still running
    assert len([e for e in first.events if e.token_id is not None]) < 40
    _drain(scheduler)


def test_cancel_running_and_waiting_requests(engines):
    folder, _ = engines
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1, max_batch=1))
    scheduler = Scheduler(engine)
    running, waiting = Collector(), Collector()
    cancel_running, cancel_waiting = threading.Event(), threading.Event()
    scheduler.submit(_req(PROMPTS[1], n=40), running, cancel=cancel_running)
    scheduler.submit(_req(PROMPTS[0], n=40), waiting, cancel=cancel_waiting)
    for _ in range(4):
        scheduler.step()
    cancel_running.set()
    cancel_waiting.set()
    _drain(scheduler)
    assert str(running.result.finish_reason) == "cancelled"
    assert waiting.error is None and str(waiting.result.finish_reason) == "cancelled"
    assert waiting.result.token_ids == ()


def test_bad_request_fails_alone(engines):
    folder, solo = engines
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1))
    scheduler = Scheduler(engine)
    bad, good = Collector(), Collector()
    scheduler.submit(GenerateRequest(prompt=""), bad)
    scheduler.submit(_req(PROMPTS[0]), good)
    _drain(scheduler)
    assert isinstance(bad.error, InvalidPromptError)
    assert good.result.token_ids == _solo(solo, _req(PROMPTS[0]))


def test_turns_of_one_session_run_in_order(engines):
    folder, solo = engines
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1))
    scheduler = Scheduler(engine)
    sid = engine.create_session()
    a, b = Collector(), Collector()
    scheduler.submit(_req(PROMPTS[0], n=4), a, session_id=sid)
    scheduler.submit(_req([7, 8], n=4), b, session_id=sid)
    _drain(scheduler)
    first = list(a.result.token_ids)
    assert b.result.token_ids == _solo(solo, _req(PROMPTS[0] + first + [7, 8], n=4))


def test_int4_batched_answers_follow_their_solo_runs_up_to_a_near_tie(int4_model_dir):
    """int4: on the engine's kernels a four-row step gives each row the bits of a one-row
    step; on ONNX Runtime's it may round differently (the promise in
    tests/engine/equivalence.py and docs/kv-and-scheduling.md); fp32 above is exact."""
    solo = Engine.load(int4_model_dir, EngineConfig(intra_op_threads=1, prefix_cache=False))
    engine = Engine.load(int4_model_dir, EngineConfig(intra_op_threads=1, max_batch=4))
    rng = random.Random(0)
    parted = []
    for _ in range(4):
        scheduler = Scheduler(engine)
        requests = [_req([rng.randrange(1, 2000) for _ in range(rng.randrange(3, 40))],
                         n=32, top_logprobs=5) for _ in range(4)]
        sinks = [Collector() for _ in requests]
        for req, sink in zip(requests, sinks, strict=True):
            scheduler.submit(req, sink)
        _drain(scheduler)
        assert scheduler.batched_steps >= 31  # the four decoded together
        for req, sink in zip(requests, sinks, strict=True):
            assert sink.error is None
            solo.runner.reset()
            alone = solo.generate(req)
            parted.append(assert_follows_solo_up_to_a_near_tie(
                alone, sink.result.token_ids, sink.result.logprobs))
            if exact_paths(engine):
                assert sink.result.token_ids == alone.token_ids
                assert sink.result.logprobs == alone.logprobs
    print("int4 batched answers parting from solo at:", parted)


def test_the_near_tie_check_refuses_an_answer_that_left_without_a_tie(engines):
    _, solo = engines
    solo.runner.reset()
    result = solo.generate(_req(PROMPTS[1], n=12, top_logprobs=5))
    tokens = list(result.token_ids)
    assert assert_follows_solo_up_to_a_near_tie(result, tokens, result.logprobs) is None
    top = result.logprobs[3].top
    far = next(t for t, lp in top if top[0][1] - lp > 1.0)  # the sharp model: clear choices
    with pytest.raises(AssertionError, match="step 3: not a near-tie"):
        assert_follows_solo_up_to_a_near_tie(result, [*tokens[:3], far, *tokens[4:]])
    with pytest.raises(AssertionError, match="step 3: token 1999 is not among"):
        assert_follows_solo_up_to_a_near_tie(result, [*tokens[:3], 1999, *tokens[4:]])
