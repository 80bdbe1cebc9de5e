"""Decode runners on real ORT sessions: growth, rewind, multi-token steps."""

import numpy as np
import pytest

from engine.config import EngineConfig, GenerateOptions
from engine.engine import Engine, GenerateRequest
from engine.runtime.decode_gqa import KVBank, SharedBufferRunner

IDS = np.array([5, 17, 42, 99, 7, 300, 12, 8, 9, 10], dtype=np.int64)


def _greedy_run(runner, prompt, n):
    logits = runner.forward(prompt)
    out = []
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append(token)
        logits = runner.forward(np.array([token], dtype=np.int64))
    return out


@pytest.fixture(scope="module", params=["genai", "optimum", "static"])
def engine(request, genai_model_dir, optimum_model_dir, static_model_dir):
    folder = {"genai": genai_model_dir, "optimum": optimum_model_dir,
              "static": static_model_dir}[request.param]
    return Engine.load(folder, EngineConfig(intra_op_threads=1))


def test_rewind_then_rerun_gives_identical_logits(engine):
    runner = engine.runner
    runner.reset()
    first = runner.forward(IDS).copy()
    after = runner.forward(np.array([3], dtype=np.int64)).copy()
    runner.rewind(1)
    assert runner.length == len(IDS)
    again = runner.forward(np.array([3], dtype=np.int64))
    np.testing.assert_array_equal(after, again)
    runner.rewind(len(IDS) + 1)
    np.testing.assert_array_equal(first, runner.forward(IDS))
    runner.reset()


def test_multi_token_step_equals_single_steps(engine):
    runner = engine.runner
    runner.reset()
    runner.forward(IDS[:4])
    many = runner.forward(IDS[4:8], all_logits=True).copy()
    runner.rewind(4)
    singles = np.stack([runner.forward(IDS[i:i + 1]).copy() for i in range(4, 8)])
    np.testing.assert_allclose(many, singles, rtol=1e-4, atol=1e-4)
    runner.reset()


def test_rewind_refuses_more_than_cached(engine):
    engine.runner.reset()
    engine.runner.forward(IDS[:3])
    with pytest.raises(ValueError, match="cannot rewind 4 of 3"):
        engine.runner.rewind(4)
    engine.runner.reset()


def test_shared_buffer_starts_small_and_grows_without_changing_tokens(genai_model_dir):
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    bank = KVBank(engine.session, engine.spec, engine.context_length, max_rows=1)
    small = bank.add_runner(initial_capacity=16)
    assert small.capacity == 16
    assert bank.nbytes == 16 * engine.spec.kv_bytes_per_token
    grown = _greedy_run(small, IDS, 40)  # 50 tokens: grows past 16 mid-generation
    assert small.capacity >= 50 and small.capacity <= engine.context_length
    engine.runner.reset()
    assert grown == _greedy_run(engine.runner, IDS, 40)


def test_a_growing_bank_takes_headroom_only_where_the_governor_has_room(genai_model_dir):
    # An editor's prompt grows a token or two per keystroke; growing by exact steps copied
    # the whole bank every 64 tokens. It grows by a quarter more when there is room, and
    # by what is needed when there is not.
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    per_token = engine.spec.kv_bytes_per_token
    asked: list[int] = []
    for room, expected in ((True, 704), (False, 576)):
        def may_grow(nbytes: int, room: bool = room) -> bool:
            asked.append(nbytes)
            return room
        # (a longer context than the tiny model's 256: only buffers are made here)
        bank = KVBank(engine.session, engine.spec, 4096, max_rows=1, may_grow=may_grow)
        runner = bank.add_runner(initial_capacity=512)
        runner.reserve(520)  # needs 576 (the next step of 64)
        assert runner.capacity == expected and bank.nbytes == expected * per_token
        runner.reserve(expected)  # within what it holds: nothing moves
        assert runner.capacity == expected
    # the headroom's bytes, asked first: max(512 x 1.25, 576 x 1.125 = 648) -> 704
    assert asked == [192 * per_token, 192 * per_token]
    exact = KVBank(engine.session, engine.spec, 4096, max_rows=1)
    runner = exact.add_runner(initial_capacity=512)
    runner.reserve(520)
    assert runner.capacity == 576  # no governor to ask: never more than needed


def test_batched_decode_of_different_lengths_equals_solo_runs(genai_model_dir):
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    prompts = [IDS[:3], IDS, IDS[2:9]]
    solo = []
    for prompt in prompts:
        engine.runner.reset()
        solo.append(_greedy_run(engine.runner, prompt, 12))
    bank = KVBank(engine.session, engine.spec, engine.context_length, max_rows=3)
    runners = [bank.add_runner() for _ in prompts]
    tokens = [int(np.argmax(r.forward(p))) for r, p in zip(runners, prompts, strict=True)]
    batched = [[t] for t in tokens]
    for _ in range(11):
        logits = bank.forward_batch(runners, tokens)
        tokens = [int(np.argmax(row)) for row in logits]
        for out, t in zip(batched, tokens, strict=True):
            out.append(t)
    assert batched == [s[:12] for s in solo]
    # a row left out of a step keeps its cache; others may step without it
    runners[1].rewind(runners[1].length - len(IDS))
    logits = bank.forward_batch([runners[0], runners[2]], [tokens[0], tokens[2]])
    assert logits.shape[0] == 2
    assert int(np.argmax(runners[1].forward(np.array([solo[1][0]])))) == solo[1][1]


def test_engine_reserves_for_the_request_not_the_whole_context(genai_model_dir):
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    assert isinstance(engine.runner, SharedBufferRunner)
    engine.generate(GenerateRequest(token_ids=(1, 2, 3), options=GenerateOptions(
        max_new_tokens=10, temperature=0.0)))
    assert engine.runner.capacity == 64 < engine.context_length
    engine.generate(GenerateRequest(token_ids=(1, 2, 3), options=GenerateOptions(
        max_new_tokens=100, temperature=0.0, stop_on_eos=False)))
    # 103 tokens: the next step (128) and an eighth more, rounded to a step (KVBank's
    # headroom: the governor has room here), still short of the context
    assert engine.runner.capacity == 192 < engine.context_length
