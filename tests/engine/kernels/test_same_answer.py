"""The built-in model gives the same greedy answer, bit for bit, whatever the path: a repeat
whose prompt KV is reused, a prefill in chunks of any size, a batch of four, prompt-lookup
speculation (engine/kernels: MatMulNBits and attention compute a row the same way however
many rows a run has). With ONNX Runtime's kernels (ONNX_GENAI_KERNELS=0) all of them but
the chunks of 64 fail (these prompts fit one chunk of 64)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import ChatMessage, Engine, EngineConfig, GenerateOptions, GenerateRequest, kernels
from engine.model.default_model import default_model_dir
from engine.scheduling.scheduler import Scheduler

FOUND = default_model_dir()
MODEL = FOUND if FOUND is not None else Path("missing")
pytestmark = [
    pytest.mark.skipif(kernels.library() is None,
                       reason="the engine's kernels were not built (no C compiler)"),
    pytest.mark.skipif(FOUND is None, reason="no built-in model in this checkout")]

PROMPTS = ("What is the capital of France? Answer in one long paragraph.",
           "Write a haiku about the sea.", "List three uses of a brick.")


def _request(prompt: str) -> GenerateRequest:
    return GenerateRequest(messages=(ChatMessage("user", prompt),),
                           options=GenerateOptions(max_new_tokens=32, temperature=0.0,
                                                   top_logprobs=2))


def test_a_repeat_that_reuses_the_prompt_kv_gives_the_same_tokens_and_logprobs():
    engine = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    try:
        for prompt in PROMPTS:
            first = engine.generate(_request(prompt))
            again = engine.generate(_request(prompt))
            assert again.prefix_cache_hit_len > 0  # the repeat's prompt came from the cache
            assert list(again.token_ids) == list(first.token_ids), prompt
            assert [t.logprob for t in again.logprobs] == [t.logprob for t in first.logprobs]
    finally:
        engine.close()


def test_a_prefill_in_chunks_of_1_7_64_or_all_gives_the_same_logits():
    engine = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    try:
        ids = np.random.default_rng(0).integers(100, 40000, size=150).astype(np.int64)
        last = {}
        for chunk in (1, 7, 64, len(ids)):
            engine.runner.reset()
            for start in range(0, len(ids), chunk):
                logits = engine.runner.forward(ids[start:start + chunk])
            last[chunk] = logits.copy()
        for chunk in (1, 7, 64):
            np.testing.assert_array_equal(last[chunk], last[len(ids)], err_msg=f"{chunk}")
    finally:
        engine.close()


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_the_prefill_chunk_size_does_not_change_a_greedy_answer(chunk):
    whole = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    chunked = Engine.load(MODEL, EngineConfig(intra_op_threads=2, prefill_chunk_size=chunk))
    try:
        for prompt in PROMPTS[:2]:
            want, got = whole.generate(_request(prompt)), chunked.generate(_request(prompt))
            assert list(got.token_ids) == list(want.token_ids), prompt
            assert [t.logprob for t in got.logprobs] == [t.logprob for t in want.logprobs]
    finally:
        whole.close()
        chunked.close()


def _ids_request(ids: tuple[int, ...], **options: object) -> GenerateRequest:
    options = {"max_new_tokens": 24, **options}
    return GenerateRequest(token_ids=ids, options=GenerateOptions(
        temperature=0.0, stop_on_eos=False, **options))  # type: ignore[arg-type]


def test_a_batch_of_four_gives_each_request_its_solo_answer():
    engine = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    try:
        rng = np.random.default_rng(1)
        prompts = [tuple(int(x) for x in rng.integers(100, 40000, size=n)) for n in (20, 33, 47)]
        prompts.append(prompts[0] * 3)
        solo = [engine.generate(_ids_request(p, top_logprobs=1)) for p in prompts]
        scheduler = Scheduler(engine)
        results: list[list[object]] = [[] for _ in prompts]
        for prompt, sink in zip(prompts, results, strict=True):
            scheduler.submit(_ids_request(prompt, top_logprobs=1), sink.append)
        while scheduler.step():
            pass
        for alone, sink in zip(solo, results, strict=True):
            batched = sink[-1].result  # type: ignore[attr-defined]
            assert list(batched.token_ids) == list(alone.token_ids)
            assert [t.logprob for t in batched.logprobs] == [t.logprob for t in alone.logprobs]
    finally:
        engine.close()


def test_prompt_lookup_speculation_gives_plain_greedys_tokens():
    engine = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    try:
        rng = np.random.default_rng(1)
        prompts = [tuple(int(x) for x in rng.integers(100, 40000, size=20)) * 3,
                   tuple(int(x) for x in rng.integers(100, 4000, size=30)) * 2]
        for prompt in prompts:
            plain = engine.generate(_ids_request(prompt, max_new_tokens=48))
            engine.runner.reset()
            guessed = engine.generate(_ids_request(prompt, max_new_tokens=48,
                                                   speculative_mode="prompt_lookup"))
            assert guessed.speculation is not None and guessed.speculation.accepted > 0
            assert list(guessed.token_ids) == list(plain.token_ids)
    finally:
        engine.close()


def test_these_answers_are_16_bit_kvs():
    """The built-in model keeps its KV in 16 bits (engine.model.kv16_pass): int16 rows and
    their scales where the CPU runs them on VNNI (23,400 bytes a token), else float16
    (half of float32's 46,080), and the paths above are that cache's."""
    engine = Engine.load(MODEL, EngineConfig(intra_op_threads=2))
    try:
        if kernels.i16kv_preferred():
            assert {p.dtype for p in engine.spec.kv_pairs} == {"int16"}
            assert engine.spec.kv_bytes_per_token == 23400
        else:
            assert {p.dtype for p in engine.spec.kv_pairs} == {"float16"}
            assert engine.spec.kv_bytes_per_token == 23040
    finally:
        engine.close()
