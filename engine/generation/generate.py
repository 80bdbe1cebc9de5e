"""The token loop: chunked prefill, then one token per step. Knows nothing of text."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.config import GenerateOptions
from engine.errors import InvalidOptionError
from engine.generation.guidance import TokenConstraint
from engine.generation.logits import ProcessorContext, apply_processors, make_logits_processors
from engine.generation.mtp import MtpHead, MtpProposer
from engine.generation.sampling import Sampler, TokenLogprob, make_sampler, token_logprob
from engine.generation.speculative import (
    AdaptiveK,
    DraftModel,
    PromptLookup,
    Proposer,
    SpeculativeStats,
    verify_greedy,
)
from engine.runtime.runner import DecodeRunner


@dataclass
class LoopClock:
    """Wall-clock marks of one generation, filled in by `TokenSequence`."""

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


class TokenSequence:
    """One request's token loop as steps a scheduler can interleave or batch.

    The runner must hold exactly the KV of `prompt_ids[:cached]` (reused from a cache).
    `prefill_chunk()` runs the rest of the prompt a chunk at a time and, after the last
    chunk, samples the first token; then each decode step feeds `pending` and hands the
    logits to `accept()`. The last token is never fed to the model, so a full context costs
    no extra forward pass. A `constraint` (llguidance, built by the text layer) masks the
    logits and ends the sequence once its grammar closed; such a sequence never
    speculates (each token's mask needs the one before) but batches with others.

    KV: `reserve` tokens (prompt and answer; None = all that `max_total` and
    `max_new_tokens` allow) are reserved at the start. When the answer reaches them,
    `grow(runner, total)` is asked for `grow_step` more (True: the runner holds them now);
    a refusal, or no `grow`, ends the sequence as a full context does (finish ``length``).
    """

    def __init__(self, runner: DecodeRunner, prompt_ids: Sequence[int],
                 options: GenerateOptions, *, max_total: int, chunk_size: int,
                 cached: int = 0, stop_token_ids: Sequence[int] = (),
                 sampler: Sampler | None = None, clock: LoopClock | None = None,
                 constraint: TokenConstraint | None = None,
                 draft_runner: DecodeRunner | None = None,
                 mtp_head: MtpHead | None = None, reserve: int | None = None,
                 grow: Callable[[DecodeRunner, int], bool] | None = None,
                 grow_step: int = 64, exact: bool = False) -> None:
        assert runner.length == cached < len(prompt_ids), "the runner must hold the prefix"
        self.runner = runner
        self.options = options
        self.clock = clock or LoopClock()
        self.clock.start = self.clock.start or time.perf_counter()
        self.clock.prefill_tokens = len(prompt_ids) - cached
        self._limit = min(max_total, len(prompt_ids) + options.max_new_tokens)
        #: Tokens (prompt and answer) the runner holds room for: what this request reserved.
        self.reserved = self._limit if reserve is None else \
            min(self._limit, max(len(prompt_ids) + 1, reserve))
        self._grow = grow
        self._grow_step = max(1, grow_step)
        #: Times the reservation grew, and whether growth was refused (the answer ended).
        self.grown = 0
        self.growth_refused = False
        runner.reserve(self.reserved)
        self._ids = np.asarray(prompt_ids, dtype=np.int64)
        self._next = cached
        self._chunk = chunk_size
        self._max_total = max_total
        self._total = len(prompt_ids)
        self.constraint = constraint
        self._chain = make_logits_processors(options, stop_token_ids=stop_token_ids,
                                             constraint=constraint)
        self._sampler = sampler or make_sampler(options)
        self._context = ProcessorContext(prompt_ids=list(prompt_ids), generated_ids=[])
        self._top_n = options.top_logprobs
        # A caller's sampler sees every step's logits: no argmax shortcut, no speculation.
        self._fast_greedy = (options.is_greedy and not self._chain and self._top_n is None
                             and sampler is None)
        self.speculation: SpeculativeStats | None = None
        #: The MTP proposer, which needs the hidden state behind each pending token.
        self._mtp: MtpProposer | None = None
        # "auto": prompt lookup where a verify pass gives each row a single step's bits
        # (`exact`: the engine's kernels run every node), in steps this sequence runs alone
        self._auto = options.speculative_mode == "auto"
        mode = ("prompt_lookup" if exact else "none") if self._auto else options.speculative_mode
        #: Auto mode's pause after failed guesses: steps left, and the pause's length.
        self._wait = self._pause = 0
        if mode != "none" and self._fast_greedy and not runner.spec.logits_last_only:
            self._proposer = make_proposer(options, draft_runner, mtp_head, mode)
            if isinstance(self._proposer, MtpProposer):
                self._mtp = self._proposer
            self._k = AdaptiveK(options.num_speculative_tokens, 16)
            self.speculation = SpeculativeStats()
        self.generated = 0
        self.done = False
        #: The sampled token the model has not seen yet (the next decode input).
        self.pending: int | None = None

    @property
    def prefilling(self) -> bool:
        return self._next < len(self._ids)

    def prefill_chunk(self) -> StepOutput | None:
        end = min(self._next + self._chunk, len(self._ids))
        logits = self.runner.forward(self._ids[self._next:end])
        self._next = end
        return None if self.prefilling else self.accept(logits)

    @property
    def batchable(self) -> bool:
        """One token per step (speculating sequences verify several alone; in auto mode a
        batched step is a plain step, and the sequence speculates when it runs alone)."""
        return self.speculation is None or self._auto

    def decode(self) -> list[StepOutput]:
        """Feed `pending` on this sequence's runner alone: the next token, or several when
        speculation guessed right."""
        assert self.pending is not None and not self.done
        if self.speculation is not None:
            steps = self._speculate()
            if steps:
                return steps
            self.speculation.forwards += 1  # nothing to guess: a plain step
            self.speculation.tokens += 1
        step = np.array([self.pending], dtype=np.int64)
        if self._fast_greedy and self._mtp is None:  # the argmax may stay on the device
            return [self._record(self.runner.forward_greedy(step), None)]
        return [self.accept(self.runner.forward(step))]

    def _speculate(self) -> list[StepOutput]:
        assert self.pending is not None and self.speculation is not None
        budget = min(self.options.max_new_tokens - self.generated, self._max_total - self._total,
                     self.reserved - self._total + 1,  # guesses stay within the reservation
                     self.runner.room_ahead())  # and before a window's next drop
        k = min(self._k.k, budget - 1)
        if self._wait:  # auto mode, after failed guesses: plain steps for a while
            self._wait -= 1
            return []
        history = [*self._context.prompt_ids, *self._context.generated_ids]
        started = time.perf_counter()
        draft = self._proposer.propose(history, k)
        self.speculation.propose_s += time.perf_counter() - started
        if not draft:
            return []
        rows = self.runner.forward(np.array([self.pending, *draft], dtype=np.int64),
                                   all_logits=True)
        tokens = verify_greedy(rows, draft)
        self._track_hidden(len(tokens) - 1)  # the row that chose the new pending token
        self.runner.rewind(len(draft) - (len(tokens) - 1))  # the KV of rejected guesses
        stats = self.speculation
        stats.proposed += len(draft)
        stats.accepted += len(tokens) - 1
        stats.forwards += 1
        stats.tokens += len(tokens)
        self._k.update(len(draft), len(tokens) - 1)
        if self._auto:  # a failed guess cost a wider pass: wait 1, 2, 4 ... 32 steps
            failed = 2 * (len(tokens) - 1) < len(draft)
            self._pause = min(2 * self._pause or 1, 32) if failed else 0
            self._wait = self._pause
        return [self._record(token, None) for token in tokens]

    def _track_hidden(self, row: int) -> None:
        if self._mtp is not None:
            rows = self.runner.last_hidden
            self._mtp.hidden = None if rows is None else np.array(rows[row])

    def accept(self, logits: np.ndarray) -> StepOutput:
        """Sample from the logits of the last position fed."""
        self._track_hidden(-1)
        if self._fast_greedy:
            token, logprob = int(np.argmax(logits)), None
        else:
            processed = apply_processors(logits, self._chain, self._context) \
                if self._chain else logits
            token = self._sampler(processed, self._context)
            logprob = (token_logprob(processed, token, self._top_n)
                       if self._top_n is not None else None)
        return self._record(token, logprob)

    def _record(self, token: int, logprob: TokenLogprob | None) -> StepOutput:
        now = time.perf_counter()
        if self.generated == 0:
            self.clock.first_token = now
        else:
            self.clock.steps += 1
        self.clock.last_token = now
        self.generated += 1
        self._total += 1
        self._context.append(token)
        full = self._total >= self._max_total
        ended = False
        if self.constraint is not None:
            self.constraint.sync(self._context.generated_ids)
            ended = self.constraint.closed
        self.done = full or ended or self.generated == self.options.max_new_tokens
        if not self.done and self._total > self.reserved and not self._extend():
            full = self.done = True  # no room to go on: it ends as at a full context
        self.pending = None if self.done else token
        return StepOutput(token, logprob, full)

    def _extend(self) -> bool:
        """Reserve `grow_step` more tokens (feeding `pending` needs one more than held)."""
        total = min(self._limit, self.reserved + self._grow_step)
        if self._grow is None or not self._grow(self.runner, total):
            self.growth_refused = True
            return False
        self.reserved = total
        self.grown += 1
        return True


def make_proposer(options: GenerateOptions, draft_runner: DecodeRunner | None,
                  mtp_head: MtpHead | None, mode: str | None = None) -> Proposer:
    """The proposer `mode` (default `options.speculative_mode`) asks for; an error when the
    engine lacks it."""
    mode = mode or options.speculative_mode
    if mode == "prompt_lookup":
        return PromptLookup(options.speculative_ngram, 16)
    if mode == "draft_model" and draft_runner is not None:
        return DraftModel(draft_runner)
    if mode == "mtp" and mtp_head is not None:
        return MtpProposer(mtp_head)
    if mode == "mtp":
        raise InvalidOptionError(
            "speculative_mode", "'mtp' needs a model whose inference metadata declares an "
            "MTP head this engine can run", hint="see docs/speculative.md, 'Declared speculative "
            "heads', or use 'prompt_lookup'")
    raise InvalidOptionError(
        "speculative_mode", "'draft_model' needs an engine loaded with a draft model",
        hint="load the engine with EngineConfig(draft_model=DIR)")
