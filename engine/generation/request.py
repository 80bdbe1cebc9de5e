"""One request's text layer: stop checks, streaming text and the final result.

`RequestRun` turns the token steps of a `TokenSequence` into `GenerateEvent`s. It does not
drive the model: `Engine.stream` drives one run alone, the scheduler drives many at once
(interleaved or batched). Both go through the same code, so their outputs match.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine.api import GenerateEvent, GenerateRequest, GenerateResult, Timings
from engine.generation.generate import LoopClock, StepOutput, TokenSequence
from engine.generation.guidance import TokenConstraint
from engine.generation.mtp import MtpHead
from engine.generation.sampling import CustomSamplerCall, TokenLogprob
from engine.generation.stopping import JSON_COMPLETE, FinishReason, StopChecker
from engine.runtime.runner import DecodeRunner
from engine.text.reasoning import ThoughtSplitter, think_tags, thought_mode
from engine.text.tokenizer import Tokenizer

#: Endings whose held-back text is still output (at EOS it can no longer become a stop
#: string, a think tag or a longer character).
_FLUSHED = ("max_tokens", "length", "cancelled", "json_complete", "eos_token")


class RequestRun:
    def __init__(self, request: GenerateRequest, prompt: list[int], *, runner: DecodeRunner,
                 tokenizer: Tokenizer, eos: tuple[int, ...], max_total: int, chunk_size: int,
                 cached: int, cancel: threading.Event | None, started: float,
                 dropped: int = 0, draft_runner: DecodeRunner | None = None,
                 mtp_head: MtpHead | None = None, reserve: int | None = None,
                 grow: Callable[[DecodeRunner, int], bool] | None = None,
                 grow_step: int = 64, exact: bool = False) -> None:
        options = request.options
        self.request = request
        self.prompt = prompt
        self.runner = runner
        self.cancel = cancel
        self.started = started
        self.cached = cached
        self.dropped = dropped
        self._stopper = StopChecker(options, eos_token_ids=eos, healed=request.healed)
        self._detok = tokenizer.detokenizer(skip_special=True)
        self._thoughts, self._tag_texts = self._thought_splitter(request, prompt, tokenizer)
        self._thought_pieces: list[str] = []
        single = [s[0] for s in options.stop_sequences if isinstance(s, tuple) and len(s) == 1]
        self.clock = LoopClock(start=started)
        self._constraint = None if options.constraint is None else TokenConstraint(
            options.constraint, tokenizer, runner.spec.vocab_size,
            end_ids=eos if options.stop_on_eos else (),
            banned_ids=tokenizer.special_token_ids)
        self.sequence = TokenSequence(
            runner, prompt, options, max_total=max_total, cached=cached, chunk_size=chunk_size,
            stop_token_ids=[*eos, *single] if options.stop_on_eos else single,
            clock=self.clock, constraint=self._constraint, draft_runner=draft_runner,
            mtp_head=mtp_head, reserve=reserve, grow=grow, grow_step=grow_step, exact=exact,
            sampler=None if request.sampler is None else CustomSamplerCall(request.sampler,
                                                                           prompt))
        #: Every token the model produced, EOS included.
        self.sampled: list[int] = []
        self._logprobs: list[TokenLogprob] = []
        self._pieces: list[str] = []
        self.finish: FinishReason | None = None

    @staticmethod
    def _thought_splitter(request: GenerateRequest, prompt: list[int], tokenizer: Tokenizer
                          ) -> tuple[ThoughtSplitter | None, dict[int, str]]:
        """A chat request to a reasoning model splits its thoughts from its answer (also a
        chat turn given as ids that says so; under a constraint only when its grammar lets
        free text come first, as a tool call's ``auto`` does: a JSON format shapes the
        whole output); the tags' texts by id where the detokenizer would drop them."""
        mode = request.thoughts
        if mode is None and request.messages is not None:
            mode = thought_mode(tokenizer, prompt)
        tags = think_tags(tokenizer)
        constraint = request.options.constraint
        if mode in (None, "off") or tags is None or (constraint is not None
                                                       and not constraint.prose_first):
            return None, {}
        skipped = {i: t for i, t in ((tags.open_id, tags.open), (tags.close_id, tags.close))
                   if i is not None and i in tokenizer.skipped_ids}
        return ThoughtSplitter(tags, inside=mode == "open"), skipped

    def _split_text(self, token_id: int) -> tuple[str, str]:
        """The token's text as (thought, answer): a reasoning model's thoughts apart (kept
        for the result too); everything is answer for other requests."""
        piece = self._detok.add(token_id)
        if self._thoughts is None:
            return "", piece
        thought, answer = self._thoughts.feed(piece + self._tag_texts.get(token_id, ""))
        self._thought_pieces.append(thought)
        return thought, answer

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    @property
    def finished(self) -> bool:
        return self.finish is not None or self.sequence.done or self.cancelled

    def on_step(self, step: StepOutput) -> GenerateEvent | None:
        """Account for one sampled token; the event to emit, if the token is output."""
        self.sampled.append(step.token_id)
        if self._constraint is not None:
            return self._on_constrained_step(step, self._constraint)
        finish = self._stopper.check_token(step.token_id, self.sampled)
        if finish is not None and finish.kind == "eos_token":
            self.finish = finish
            return None
        if step.logprob is not None:
            self._logprobs.append(step.logprob)
        text = thought = ""
        if finish is None:
            thought, answer = self._split_text(step.token_id)
            text, finish = self._stopper.feed_text(answer)
        self._pieces.append(text)
        if finish is None and step.context_full and \
                len(self.sampled) < self.request.options.max_new_tokens:
            finish = FinishReason("length")
        self.finish = finish
        return GenerateEvent(text, step.token_id, step.logprob, time.perf_counter(),
                             thought=thought)

    def _on_constrained_step(self, step: StepOutput,
                             constraint: TokenConstraint) -> GenerateEvent | None:
        """`on_step` under a constraint: stops wait for a complete answer, no text is held
        back or cut, and a closed grammar ends the generation."""
        thought, text = self._split_text(step.token_id)
        complete = constraint.complete
        full = "".join(self._pieces) + text if complete else text
        finish = self._stopper.check_constrained(step.token_id, self.sampled, full, len(text),
                                                 complete=complete)
        if finish is not None and finish.kind == "eos_token":
            self.finish = finish
            return None
        if step.logprob is not None:
            self._logprobs.append(step.logprob)
        self._pieces.append(text)
        if finish is None and constraint.closed:
            finish = JSON_COMPLETE
        if finish is None and step.context_full and \
                len(self.sampled) < self.request.options.max_new_tokens:
            finish = FinishReason("length")
        self.finish = finish
        return GenerateEvent(text, step.token_id, step.logprob, time.perf_counter(),
                             thought=thought)

    def advance(self) -> list[GenerateEvent]:
        """Run this request alone for one step: a prefill chunk, or a decode step (which
        yields several tokens when speculation guessed right)."""
        seq = self.sequence
        if seq.prefilling:
            first = seq.prefill_chunk()
            steps = [first] if first is not None else []
        else:
            steps = seq.decode()
        events = []
        for step in steps:
            if self.finish is not None:
                break  # a stop within a verified block: the rest is not output
            event = self.on_step(step)
            if event is not None:
                events.append(event)
        return events

    def closing_events(self) -> list[GenerateEvent]:
        """The held-back text (if any) and the final event carrying the result (a limit
        mid-way through a constrained answer keeps the text so far, as OpenAI does)."""
        finish = self.finish or FinishReason("cancelled" if self.cancelled else "max_tokens")
        events = []
        if finish.kind in _FLUSHED:
            tail, thought = self._detok.flush(), ""
            if self._thoughts is not None:
                thought, tail = self._thoughts.feed(tail)
                more_thought, more = self._thoughts.flush()
                thought, tail = thought + more_thought, tail + more
                self._thought_pieces.append(thought)
            if self._constraint is None:
                tail, _ = self._stopper.feed_text(tail)
                tail += self._stopper.flush()
            if tail or thought:
                self._pieces.append(tail)
                events.append(GenerateEvent(tail, None, None, time.perf_counter(),
                                            thought=thought))
        ended = time.perf_counter()
        generated = self.sampled[:-1] if finish.kind == "eos_token" else self.sampled
        clock = self.clock
        timings = Timings(ttft_ms=clock.ttft_s * 1e3, prefill_tok_s=clock.prefill_tok_s,
                          decode_tok_s=clock.decode_tok_s,
                          total_ms=(ended - self.started) * 1e3)
        result = GenerateResult(
            text="".join(self._pieces), token_ids=tuple(generated), finish_reason=finish,
            prompt_tokens=len(self.prompt), timings=timings, logprobs=tuple(self._logprobs),
            prefix_cache_hit_len=self.cached, speculation=self.sequence.speculation,
            prompt_tokens_dropped=self.dropped, thoughts="".join(self._thought_pieces))
        events.append(GenerateEvent("", None, None, ended, result=result))
        return events
