"""Custom samplers: a request's own token choice after the processor chain."""

import numpy as np
import pytest

from engine import (
    Engine,
    EngineConfig,
    GenerateOptions,
    GenerateRequest,
    InvalidOptionError,
    SamplerContext,
    SamplerError,
)
from engine.scheduling.scheduler import Scheduler

PROMPT = (5, 17, 42, 99, 7, 300, 12)
PATTERN = (1, 2, 3, 4) * 12


@pytest.fixture(scope="module")
def genai(genai_model_dir) -> Engine:
    return Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))


def _generate(engine, sampler, n=6, prompt=PROMPT, **kw):
    options = GenerateOptions(max_new_tokens=n, stop_on_eos=False, **kw)
    return engine.generate(GenerateRequest(token_ids=prompt, options=options, sampler=sampler))


def test_a_sampler_that_always_picks_a_token_gets_that_token(genai):
    result = _generate(genai, lambda logits, ctx: 77, temperature=0.0)
    assert result.token_ids == (77,) * 6


def test_the_sampler_sees_processed_logits_and_its_context(genai):
    seen: list[tuple[np.ndarray, SamplerContext]] = []

    def record(logits: np.ndarray, context: SamplerContext) -> int:
        seen.append((logits, context))
        return int(np.argmax(logits))

    biased = _generate(genai, record, n=4, temperature=0.0, logit_bias={123: 100.0})
    assert biased.token_ids == (123,) * 4  # the bias was applied before the sampler
    assert [c.step for _, c in seen] == [0, 1, 2, 3]
    assert [c.generated_ids for _, c in seen] == [(), (123,), (123, 123), (123, 123, 123)]
    assert all(c.prompt_ids == PROMPT for _, c in seen)
    logits = seen[0][0]
    assert logits.dtype == np.float32 and logits.shape == (genai.spec.vocab_size,)
    seen.clear()
    _generate(genai, record, n=2, temperature=1.0, top_k=3, seed=1)
    assert all(np.count_nonzero(np.isfinite(lg)) == 3 for lg, _ in seen)  # top-k masked


def test_plain_greedy_through_a_sampler_matches_the_built_in_path(genai):
    plain = _generate(genai, None, n=12, temperature=0.0)
    custom = _generate(genai, lambda logits, ctx: int(np.argmax(logits)), n=12,
                       temperature=0.0)
    assert custom.token_ids == plain.token_ids


def test_a_sampler_turns_speculation_off(genai):
    result = _generate(genai, lambda logits, ctx: int(np.argmax(logits)), n=12,
                       prompt=PATTERN, temperature=0.0, speculative_mode="prompt_lookup")
    assert result.speculation is None
    plain = _generate(genai, None, n=12, prompt=PATTERN, temperature=0.0)
    assert result.token_ids == plain.token_ids


def test_a_failing_sampler_ends_the_request_and_the_engine_goes_on(genai):
    def boom(logits: np.ndarray, context: SamplerContext) -> int:
        if context.step == 2:
            raise ValueError("no token for you")
        return 9

    with pytest.raises(SamplerError, match=r"raised ValueError: no token for you \(at step 2\)"):
        _generate(genai, boom)
    with pytest.raises(SamplerError, match="expected a token id in 0..511"):
        _generate(genai, lambda logits, ctx: genai.spec.vocab_size)
    with pytest.raises(SamplerError, match="returned 'a'"):
        _generate(genai, lambda logits, ctx: "a")
    assert _generate(genai, None, temperature=0.0).token_ids == \
        _generate(genai, lambda logits, ctx: int(np.argmax(logits)), temperature=0.0).token_ids


def test_a_failing_sampler_in_a_batch_ends_only_its_own_request(genai):
    scheduler = Scheduler(genai)
    boxes: dict[str, list] = {"bad": [], "good": []}
    samplers = {"bad": lambda logits, ctx: 1 // 0 if ctx.step == 3 else 5, "good": None}
    for name, sampler in samplers.items():
        scheduler.submit(GenerateRequest(token_ids=PROMPT, sampler=sampler, options=GenerateOptions(
            temperature=0.0, stop_on_eos=False, max_new_tokens=8)), boxes[name].append)
    while scheduler.step():
        pass
    assert scheduler.batched_steps > 0  # the failure came out of a batched decode step
    assert isinstance(boxes["bad"][-1], SamplerError)
    assert "ZeroDivisionError" in str(boxes["bad"][-1])
    assert boxes["good"][-1].result.token_ids == _generate(genai, None, n=8,
                                                           temperature=0.0).token_ids


def test_a_sampler_must_be_callable():
    with pytest.raises(InvalidOptionError, match="sampler"):
        GenerateRequest(prompt="x", sampler=3)  # type: ignore[arg-type]
