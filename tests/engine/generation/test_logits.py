"""Logit processors: each effect in numbers, the chain order, incremental counting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.config import GenerateOptions
from engine.errors import EngineError
from engine.generation.logits import (
    NamedProcessor,
    ProcessorContext,
    apply_processors,
    make_logits_processors,
    top_k_indices,
)

NEG = -np.inf


def run(options: GenerateOptions, logits, *, prompt=(), generated=(), stop_token_ids=()):
    chain = make_logits_processors(options, stop_token_ids=stop_token_ids)
    context = ProcessorContext(prompt_ids=list(prompt))
    context.extend(list(generated))
    return apply_processors(np.array(logits, dtype=np.float32), chain, context)


def only(name: str, options: GenerateOptions, **kw) -> list[NamedProcessor]:
    chain = make_logits_processors(options, **kw)
    assert [p.name for p in chain] == [name]
    return chain


def nucleus_reference(logits: np.ndarray, p: float) -> set[int]:
    probs = np.exp(logits.astype(np.float64) - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    count = int(np.searchsorted(np.cumsum(probs[order]), p)) + 1
    return set(order[:count].tolist())


# --- the chain -------------------------------------------------------------------------


def test_default_options_give_an_empty_chain_and_untouched_logits():
    assert make_logits_processors(GenerateOptions(), stop_token_ids=[2]) == []
    assert make_logits_processors(GenerateOptions(temperature=0.0)) == []
    logits = np.array([1.0, 2.0], dtype=np.float32)
    out = apply_processors(logits, [], ProcessorContext())
    assert out is logits
    assert out.tolist() == [1.0, 2.0]


def test_chain_order_matches_the_documented_order():
    options = GenerateOptions(
        temperature=0.7, top_p=0.9, top_k=10, min_p=0.05, repetition_penalty=1.1,
        frequency_penalty=0.2, presence_penalty=0.3, stop_sequences=((7,),),
        min_new_tokens=3, logit_bias={4: 1.0},
    )
    names = [p.name for p in make_logits_processors(options, stop_token_ids=[2, 7])]
    assert names == [
        "logit_bias", "repetition_penalty", "frequency_penalty", "presence_penalty",
        "stop_sequence", "temperature", "top_k", "top_p", "min_p",
    ]


def test_greedy_drops_temperature_but_keeps_truncation():
    options = GenerateOptions(greedy=True, temperature=0.5, top_k=2, top_p=0.5, min_p=0.1)
    assert [p.name for p in make_logits_processors(options)] == ["top_k", "top_p", "min_p"]


def test_stop_mask_needs_both_min_new_tokens_and_stop_ids():
    assert make_logits_processors(GenerateOptions(min_new_tokens=2)) == []
    assert make_logits_processors(GenerateOptions(), stop_token_ids=[5]) == []


# --- each processor in numbers -----------------------------------------------------------


def test_logit_bias_adds_to_the_listed_ids():
    out = run(GenerateOptions(logit_bias={1: 2.5, 2: -100.0}), [0.0, 0.0, 0.0, 1.0])
    assert out.tolist() == [0.0, 2.5, -100.0, 1.0]


def test_logit_bias_outside_the_vocabulary_names_the_field():
    with pytest.raises(EngineError, match="logit_bias"):
        run(GenerateOptions(logit_bias={9: 1.0}), [0.0, 0.0])


def test_repetition_penalty_divides_positive_and_multiplies_negative_over_prompt_and_output():
    out = run(GenerateOptions(repetition_penalty=2.0), [2.0, -2.0, 2.0, -2.0, 0.0],
              prompt=[0, 0], generated=[1, 4])
    assert out.tolist() == [1.0, -4.0, 2.0, -2.0, 0.0]


def test_frequency_penalty_scales_with_counts_in_generated_only():
    out = run(GenerateOptions(frequency_penalty=0.5), [0.0] * 4, prompt=[3, 3],
              generated=[1, 1, 2])
    assert out.tolist() == [0.0, -1.0, -0.5, 0.0]


def test_presence_penalty_is_flat_per_generated_token():
    out = run(GenerateOptions(presence_penalty=0.5), [0.0] * 4, prompt=[3],
              generated=[1, 1, 2])
    assert out.tolist() == [0.0, -0.5, -0.5, 0.0]


def test_counts_are_incremental_across_appends_and_truncate():
    options = GenerateOptions(frequency_penalty=1.0, repetition_penalty=2.0)
    chain = make_logits_processors(options)
    context = ProcessorContext(prompt_ids=[0])
    zeros = [0.0, 0.0, 0.0, 0.0]
    fours = [4.0, 4.0, 4.0, 4.0]

    def step(values):
        return apply_processors(np.array(values, dtype=np.float32), chain, context).tolist()

    assert step(fours) == [2.0, 4.0, 4.0, 4.0]
    context.append(2)
    assert step(zeros) == [0.0, 0.0, -1.0, 0.0]  # repetition first: 0 stays 0
    context.append(2)
    context.generated_ids.append(3)  # a plain list append is picked up too
    assert step(zeros) == [0.0, 0.0, -2.0, -1.0]
    assert step(fours) == [2.0, 4.0, 0.0, 1.0]
    context.truncate(1)  # speculative rewind: only the first 2 remains
    assert context.generated_ids == [2]
    assert step(fours) == [2.0, 4.0, 1.0, 4.0]
    context.truncate(0)
    assert step(fours) == [2.0, 4.0, 4.0, 4.0]


def test_stop_sequence_masks_stop_ids_until_min_new_tokens():
    options = GenerateOptions(min_new_tokens=2)
    chain = only("stop_sequence", options, stop_token_ids=[1, 3, 99])
    context = ProcessorContext(prompt_ids=[0])
    for generated, masked in ((0, True), (1, True), (2, False)):
        context.truncate(0)
        context.extend([0] * generated)
        out = apply_processors(np.zeros(4, dtype=np.float32), chain, context)
        expected = [0.0, NEG, 0.0, NEG] if masked else [0.0] * 4
        assert out.tolist() == expected, generated


def test_temperature_divides():
    out = run(GenerateOptions(temperature=0.5), [1.0, -2.0, NEG])
    assert out.tolist() == [2.0, -4.0, NEG]


def test_top_k_keeps_the_k_largest():
    out = run(GenerateOptions(top_k=2), [1.0, 5.0, 3.0, 4.0, 2.0])
    assert out.tolist() == [NEG, 5.0, NEG, 4.0, NEG]


def test_top_k_ties_go_to_the_lower_id_and_k_at_least_vocab_is_a_no_op():
    assert run(GenerateOptions(top_k=2), [1.0, 1.0, 1.0]).tolist() == [1.0, 1.0, NEG]
    assert run(GenerateOptions(top_k=3), [1.0, 0.0, 2.0]).tolist() == [1.0, 0.0, 2.0]


def test_top_k_on_a_large_vocabulary_matches_a_full_sort():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(32000).astype(np.float32) * 3
    for k in (1, 7, 50, 600, 5000):
        expected = set(np.argsort(-logits)[:k].tolist())
        assert set(top_k_indices(logits, k).tolist()) == expected, k
        out = run(GenerateOptions(top_k=k), logits)
        assert set(np.flatnonzero(out > NEG).tolist()) == expected


def test_top_k_indices_skips_minus_inf_and_rejects_nan():
    values = np.array([NEG, 3.0, NEG, 1.0], dtype=np.float32)
    assert top_k_indices(values, 3).tolist() == [1, 3]
    assert top_k_indices(np.full(5000, NEG, dtype=np.float32), 4).size == 0
    values[2] = np.nan
    with pytest.raises(EngineError, match="NaN"):
        top_k_indices(values, 1)


def test_top_p_keeps_the_minimal_nucleus():
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    assert run(GenerateOptions(top_p=0.75), logits).tolist()[2:] == [NEG, NEG]
    assert np.isfinite(run(GenerateOptions(top_p=0.75), logits)[:2]).all()
    kept = np.isfinite(run(GenerateOptions(top_p=0.85), logits)).tolist()
    assert kept == [True, True, True, False]
    kept = np.isfinite(run(GenerateOptions(top_p=0.1), logits)).tolist()
    assert kept == [True, False, False, False]  # always at least one


@pytest.mark.parametrize("scale", [0.5, 3.0, 8.0])  # flat (big nucleus) .. peaky
def test_top_p_on_a_large_vocabulary_matches_a_full_sort(scale):
    rng = np.random.default_rng(int(scale * 10))
    logits = rng.standard_normal(32000).astype(np.float32) * scale
    for p in (0.5, 0.9, 0.99):
        out = run(GenerateOptions(top_p=p), logits)
        kept = np.flatnonzero(out > NEG)
        assert set(kept.tolist()) == nucleus_reference(logits, p)
        np.testing.assert_array_equal(out[kept], logits[kept])


def test_min_p_drops_tokens_below_the_scaled_top_probability():
    logits = np.log([0.5, 0.3, 0.02, 0.18])
    out = run(GenerateOptions(min_p=0.1), logits)  # threshold 0.05
    assert np.isfinite(out).tolist() == [True, True, False, True]
    out = run(GenerateOptions(min_p=0.5), logits)  # threshold 0.25
    assert np.isfinite(out).tolist() == [True, True, False, False]


@pytest.mark.parametrize("scale", [0.3, 6.0])  # most survive .. few survive
def test_min_p_on_a_large_vocabulary_matches_the_definition(scale):
    logits = np.random.default_rng(4).standard_normal(32000).astype(np.float32) * scale
    probs = np.exp(logits.astype(np.float64) - logits.max())
    expected = np.flatnonzero(probs >= 0.05 * probs.max())
    out = run(GenerateOptions(min_p=0.05), logits)
    assert np.flatnonzero(out > NEG).tolist() == expected.tolist()
    np.testing.assert_array_equal(out[expected], logits[expected])


def test_truncation_chain_equals_the_steps_run_separately():
    options = GenerateOptions(temperature=0.8, top_k=300, top_p=0.8, min_p=0.02)
    rng = np.random.default_rng(11)
    logits = rng.standard_normal(20000).astype(np.float32) * 2
    chained = run(options, logits.copy())
    separate = logits.copy()
    for processor in make_logits_processors(options):  # a fresh context each: no shortcuts
        separate = apply_processors(separate, [processor], ProcessorContext())
    np.testing.assert_array_equal(chained, separate)
    assert 1 <= np.isfinite(chained).sum() <= 300


# --- ownership ---------------------------------------------------------------------------


def test_apply_processors_copies_only_what_it_cannot_own():
    chain = make_logits_processors(GenerateOptions(temperature=0.5))
    owned = np.array([1.0, 2.0], dtype=np.float32)
    out = apply_processors(owned, chain, ProcessorContext())
    assert owned.tolist() == [2.0, 4.0]  # took ownership: modified in place
    assert out.tolist() == [2.0, 4.0]
    frozen = np.array([1.0, 2.0], dtype=np.float32)
    frozen.flags.writeable = False
    assert apply_processors(frozen, chain, ProcessorContext()).tolist() == [2.0, 4.0]
    assert frozen.tolist() == [1.0, 2.0]
    half = np.array([1.0, 2.0], dtype=np.float16)
    out = apply_processors(half, chain, ProcessorContext())
    assert out.dtype == np.float32 and half.tolist() == [1.0, 2.0]


def test_apply_processors_rejects_a_batch_of_logits():
    chain = make_logits_processors(GenerateOptions(temperature=0.5))
    with pytest.raises(ValueError, match="1-D"):
        apply_processors(np.zeros((1, 4), dtype=np.float32), chain, ProcessorContext())


def test_nan_logits_are_reported_by_truncation():
    logits = [0.0, math.nan, 1.0]
    for options in (GenerateOptions(top_p=0.5), GenerateOptions(min_p=0.5)):
        with pytest.raises(EngineError, match="NaN logits"):
            run(options, logits)
