"""The token loop: chunked prefill, then one token per step. Knows nothing of text."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from engine.config import GenerateOptions
from engine.decode import DecodeRunner
from engine.logits import ProcessorContext, apply_processors, make_logits_processors
from engine.sampling import Sampler, TokenLogprob, make_sampler, token_logprob


@dataclass
class LoopClock:
    """Wall-clock marks of one generation, filled in by `generate_step`."""

    start: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0
    prefill_tokens: int = 0
    steps: int = 0

    @property
    def ttft_s(self) -> float:
        return max(self.first_token - self.start, 0.0)

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.ttft_s if self.ttft_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        span = self.last_token - self.first_token
        return self.steps / span if span > 0 and self.steps else 0.0


@dataclass(frozen=True)
class StepOutput:
    token_id: int
    logprob: TokenLogprob | None
    #: True when this token filled the context: nothing more can follow.
    context_full: bool


def prefill(runner: DecodeRunner, token_ids: Sequence[int], chunk_size: int,
            cancel: threading.Event | None = None) -> np.ndarray:
    """Run the prompt in chunks of `chunk_size`; return the last position's logits."""
    ids = np.asarray(token_ids, dtype=np.int64)
    logits: np.ndarray | None = None
    for start in range(0, len(ids), chunk_size):
        if cancel is not None and cancel.is_set():
            break
        logits = runner.forward(ids[start:start + chunk_size])
    if logits is None:
        raise ValueError("prefill needs at least one token")
    return logits


def generate_step(
    runner: DecodeRunner,
    prompt_ids: Sequence[int],
    options: GenerateOptions,
    *,
    max_total: int,
    chunk_size: int,
    cached: int = 0,
    stop_token_ids: Sequence[int] = (),
    sampler: Sampler | None = None,
    cancel: threading.Event | None = None,
    clock: LoopClock | None = None,
) -> Iterator[StepOutput]:
    """Yield up to `options.max_new_tokens` tokens, never more than fit in `max_total`.

    The runner must hold exactly the KV of `prompt_ids[:cached]` (reused from a cache);
    the rest is prefilled. The caller stops consuming when a stop condition holds. The
    last token is never fed to the model, so a full context costs no extra forward pass.
    """
    clock = clock or LoopClock()
    clock.start = clock.start or time.perf_counter()
    runner.reserve(min(max_total, len(prompt_ids) + options.max_new_tokens))
    chain = make_logits_processors(options, stop_token_ids=stop_token_ids)
    sampler = sampler or make_sampler(options)
    context = ProcessorContext(prompt_ids=list(prompt_ids), generated_ids=[])
    want_logprobs = options.top_logprobs is not None
    fast_greedy = options.is_greedy and not chain and not want_logprobs
    top_n = options.top_logprobs or 0

    assert runner.length == cached < len(prompt_ids), "the runner must hold the cached prefix"
    logits = prefill(runner, prompt_ids[cached:], chunk_size, cancel)
    clock.prefill_tokens = len(prompt_ids) - cached
    total = len(prompt_ids)
    for index in range(options.max_new_tokens):
        if cancel is not None and cancel.is_set():
            return
        if fast_greedy:
            token = int(np.argmax(logits))
            logprob = None
        else:
            processed = apply_processors(logits, chain, context) if chain else logits
            token = sampler(processed, context)
            logprob = token_logprob(processed, token, top_n) if want_logprobs else None
        total += 1
        now = time.perf_counter()
        if index == 0:
            clock.first_token = now
        else:
            clock.steps += 1
        clock.last_token = now
        context.append(token)
        full = total >= max_total
        yield StepOutput(token, logprob, full)
        if full or index + 1 == options.max_new_tokens:
            return
        logits = runner.forward(np.array([token], dtype=np.int64))
