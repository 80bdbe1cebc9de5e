"""Samplers and logprobs: greedy, seeded categorical draws, inverse CDF, log-softmax."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.config import GenerateOptions
from engine.errors import EngineError
from engine.generation.logits import ProcessorContext, apply_processors, make_logits_processors
from engine.generation.sampling import (
    make_sampler,
    sample_from_probs,
    select_next_token,
    token_logprob,
)

NEG = -np.inf


def select(options: GenerateOptions, logits, sampler=None) -> int:
    chain = make_logits_processors(options)
    return select_next_token(np.array(logits, dtype=np.float32), ProcessorContext(), chain,
                             sampler or make_sampler(options))


def draws(options: GenerateOptions, logits, count: int) -> list[int]:
    chain = make_logits_processors(options)
    sampler = make_sampler(options)
    context = ProcessorContext()
    base = np.array(logits, dtype=np.float32)
    return [select_next_token(base.copy(), context, chain, sampler) for _ in range(count)]


class LastTokenSampler:
    name = "last"

    def __call__(self, logits: np.ndarray, context: ProcessorContext) -> int:
        return len(logits) - 1


def test_greedy_is_argmax_after_processors():
    assert select(GenerateOptions(greedy=True, top_k=2), [0, 2, 4, 3]) == 2
    assert make_sampler(GenerateOptions(temperature=0.0)).name == "greedy"
    # A bias moves the argmax; ties go to the lowest id.
    assert select(GenerateOptions(greedy=True, logit_bias={0: 5.0}), [0, 2, 4, 3]) == 0
    assert select(GenerateOptions(greedy=True), [1, 3, 3]) == 1


def test_custom_sampler_runs_after_the_default_processors():
    options = GenerateOptions(top_k=2)
    chain = make_logits_processors(options)
    processed = apply_processors(np.array([0, 2, 4, 3], dtype=np.float32), chain,
                                 ProcessorContext())
    assert processed[0] == NEG and processed[1] == NEG
    assert select(options, [0, 2, 4, 3], LastTokenSampler()) == 3


def test_sample_from_probs_is_an_inverse_cdf():
    logits = np.array([0.0, 0.0])
    probs = np.exp(logits) / np.exp(logits).sum()
    assert sample_from_probs(probs, 0.75) == 1
    assert sample_from_probs(probs, 0.25) == 0
    weights = np.array([0.0, 2.0, 0.0, 6.0, 0.0])  # unnormalised is fine
    assert [sample_from_probs(weights, u) for u in (0.0, 0.2, 0.3, 0.999999)] == [1, 1, 3, 3]
    with pytest.raises(ValueError):
        sample_from_probs(weights, 1.0)


def test_sample_from_probs_on_a_large_vocabulary_matches_a_flat_cdf():
    rng = np.random.default_rng(5)
    weights = rng.random(50001).astype(np.float32) ** 8
    weights[rng.random(50001) < 0.5] = 0.0
    cdf = np.cumsum(weights, dtype=np.float64)
    for u in rng.random(300):
        expected = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        assert sample_from_probs(weights, float(u)) == expected
    assert weights[sample_from_probs(weights, 0.9999999)] > 0


def test_same_seed_same_tokens_other_seed_other_tokens():
    logits = np.random.default_rng(0).standard_normal(1000)
    first = draws(GenerateOptions(seed=42), logits, 50)
    assert draws(GenerateOptions(seed=42), logits, 50) == first
    assert draws(GenerateOptions(seed=43), logits, 50) != first
    assert len(set(first)) > 10


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("options", [
    GenerateOptions(seed=7),
    GenerateOptions(seed=8, temperature=0.5),
    GenerateOptions(seed=9, top_k=3),  # the sampler works on the surviving candidates
])
def test_empirical_distribution_matches_softmax(options):
    logits = np.array([1.0, 0.0, -1.0, 2.0, 0.5])
    scaled = logits / options.temperature
    probs = np.exp(scaled - scaled.max())
    if options.top_k:
        probs[np.argsort(-scaled)[options.top_k:]] = 0.0
    probs /= probs.sum()
    counts = np.bincount(draws(options, logits, 4000), minlength=5).astype(float)
    kept = probs > 0
    assert (counts[~kept] == 0).all()
    # df <= 4; 18.47 is the 99.9% quantile; the seed makes the test deterministic.
    assert chi_square(counts[kept], probs[kept]) < 18.47


def test_sampling_never_picks_a_masked_token():
    tokens = draws(GenerateOptions(seed=1), [NEG, 0.0, NEG, 0.0, NEG], 200)
    assert set(tokens) == {1, 3}


@pytest.mark.parametrize("options", [GenerateOptions(seed=1), GenerateOptions(greedy=True)])
def test_nan_logits_raise_a_clear_error(options):
    with pytest.raises(EngineError, match="NaN logits"):
        select(options, [0.0, math.nan, 1.0])


@pytest.mark.parametrize("options", [GenerateOptions(seed=1), GenerateOptions(greedy=True)])
def test_all_masked_logits_raise_a_clear_error(options):
    with pytest.raises(EngineError, match="masked"):
        select(options, [NEG, NEG])


def test_token_logprob_of_processed_logits():
    logits = np.array([1.0, NEG, 3.0, 2.0], dtype=np.float32)
    lse = math.log(math.exp(1) + math.exp(3) + math.exp(2))
    result = token_logprob(logits, 3, 2)
    assert result.token_id == 3
    assert result.logprob == pytest.approx(2 - lse)
    assert [t for t, _ in result.top] == [2, 3]
    assert [lp for _, lp in result.top] == pytest.approx([3 - lse, 2 - lse])
    everything = token_logprob(logits, 3, 4)
    assert [t for t, _ in everything.top] == [2, 3, 0]  # the -inf token never appears
    assert token_logprob(logits, 1, 0).logprob == -math.inf
    assert token_logprob(logits, 1, 0).top == ()


def test_token_logprobs_normalise_and_sort_descending():
    logits = np.random.default_rng(2).standard_normal(30000).astype(np.float32) * 4
    result = token_logprob(logits, 0, 20)
    values = [lp for _, lp in result.top]
    assert values == sorted(values, reverse=True)
    assert [t for t, _ in result.top] == np.argsort(-logits)[:20].tolist()
    total = sum(math.exp(token_logprob(logits[:50], i, 0).logprob) for i in range(50))
    assert total == pytest.approx(1.0)
