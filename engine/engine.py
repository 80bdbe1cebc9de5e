"""The Engine facade: load a model folder, turn requests into streams of events."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.config import EngineConfig, GenerateOptions
from engine.decode import DecodeRunner, make_runner
from engine.errors import ContextOverflowError, InvalidPromptError
from engine.fim import (
    FimFamily,
    FimFile,
    FimOrder,
    build_fim_ids,
    detect_fim_family,
    fim_stop_token_ids,
    require_fim,
)
from engine.generate import LoopClock, generate_step
from engine.io_spec import IOSpec, resolve_io
from engine.model_dir import ModelDir, load_model_dir
from engine.runtime import SessionInfo, make_session
from engine.sampling import TokenLogprob
from engine.stopping import FinishReason, StopChecker
from engine.tokenizer import ChatMessage, Tokenizer

#: Special tokens that end a chat turn in the common templates.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@dataclass(frozen=True)
class GenerateRequest:
    """Exactly one of `prompt` (raw text, special tokens parsed), `messages` (chat
    template applied) or `token_ids`."""

    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    options: GenerateOptions = field(default_factory=GenerateOptions)

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.prompt, self.messages, self.token_ids)]
        if sum(given) != 1:
            raise InvalidPromptError(
                "a request needs exactly one of prompt, messages or token_ids "
                f"({sum(given)} given)", hint="pass prompt='...' for raw text")


@dataclass(frozen=True)
class Timings:
    ttft_ms: float
    prefill_tok_s: float
    decode_tok_s: float
    total_ms: float

    def as_dict(self) -> dict[str, float]:
        return {"ttft_ms": round(self.ttft_ms, 3), "prefill_tok_s": round(self.prefill_tok_s, 2),
                "decode_tok_s": round(self.decode_tok_s, 2), "total_ms": round(self.total_ms, 3)}


@dataclass(frozen=True)
class GenerateResult:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    timings: Timings
    logprobs: tuple[TokenLogprob, ...] = ()
    prefix_cache_hit_len: int = 0


@dataclass(frozen=True)
class GenerateEvent:
    """One step of a stream: a token and the text that became stable with it.

    The last event of a stream has `result` set (and no token).
    """

    text: str
    token_id: int | None
    logprob: TokenLogprob | None
    timestamp: float
    result: GenerateResult | None = None


class Engine:
    """One model, one ORT session, one KV runner. Not thread-safe: one engine thread."""

    def __init__(self, model: ModelDir, tokenizer: Tokenizer, session: Any,
                 session_info: SessionInfo, spec: IOSpec, config: EngineConfig) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.session = session
        self.session_info = session_info
        self.spec = spec
        self.config = config
        limit = config.kv_max_len or model.context_length
        self.context_length = min(limit, model.context_length,
                                  spec.static_max_len or model.context_length)
        self.runner: DecodeRunner = make_runner(session, spec, self.context_length)
        self.eos_token_ids = tuple(dict.fromkeys(model.eos_token_ids + tokenizer.eos_token_ids))
        self.fim_family: FimFamily | None = detect_fim_family(tokenizer)

    @classmethod
    def load(cls, model_dir: str | Path, config: EngineConfig | None = None) -> Engine:
        config = config or EngineConfig()
        model = load_model_dir(model_dir)
        tokenizer = Tokenizer.from_dir(model.path)
        spec = resolve_io(model.graph.inputs, model.graph.outputs, model.declared,
                          has_gqa=model.graph.has_gqa, source=model.format)
        session, info = make_session(model.model_file, config)
        return cls(model, tokenizer, session, info, spec, config)

    @property
    def provider(self) -> str:
        return self.session_info.provider

    @property
    def decode_path(self) -> str:
        return self.spec.decode_path

    def encode_request(self, request: GenerateRequest) -> list[int]:
        if request.token_ids is not None:
            ids = list(request.token_ids)
            bad = [t for t in ids if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise InvalidPromptError(
                    f"token ids {bad[:5]} are outside the vocabulary "
                    f"(0..{self.spec.vocab_size - 1})",
                    hint="encode the prompt with this model's tokenizer")
        elif request.messages is not None:
            ids = self.tokenizer.encode_chat(request.messages, add_generation_prompt=True)
        else:
            assert request.prompt is not None
            ids = self.tokenizer.encode(request.prompt, parse_special=True)
        if not ids:
            raise InvalidPromptError("the prompt is empty",
                                     hint="give at least one token of prompt text")
        return ids

    def _stop_ids(self, request: GenerateRequest) -> tuple[int, ...]:
        if request.options.eos_token_ids is not None:
            return request.options.eos_token_ids
        if request.messages is None:
            return self.eos_token_ids
        extra = (self.tokenizer.token_to_id(t) for t in _END_OF_TURN)
        return tuple(dict.fromkeys([*self.eos_token_ids, *(t for t in extra if t is not None)]))

    def max_total(self, options: GenerateOptions) -> int:
        return min(options.max_context or self.context_length, self.context_length)

    def stream(self, request: GenerateRequest,
               cancel: threading.Event | None = None) -> Iterator[GenerateEvent]:
        """Generate, yielding an event per token and a final event with the result."""
        started = time.perf_counter()
        options = request.options
        prompt = self.encode_request(request)
        max_total = self.max_total(options)
        if len(prompt) >= max_total:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens; the context holds {max_total}, leaving "
                "no room for an answer", hint="shorten the prompt or raise max_context")
        eos = self._stop_ids(request)
        stopper = StopChecker(options, eos_token_ids=eos)
        detok = self.tokenizer.detokenizer(skip_special=True)
        single_stops = [s[0] for s in options.stop_sequences
                        if isinstance(s, tuple) and len(s) == 1]
        clock = LoopClock(start=started)
        generated: list[int] = []
        logprobs: list[TokenLogprob] = []
        pieces: list[str] = []
        finish: FinishReason | None = None
        self.runner.reset()
        try:
            steps = generate_step(
                self.runner, prompt, options, max_total=max_total,
                chunk_size=self.config.prefill_chunk_size,
                stop_token_ids=[*eos, *single_stops] if options.stop_on_eos else single_stops,
                cancel=cancel, clock=clock)
            for step in steps:
                finish = stopper.check_token(step.token_id, [*generated, step.token_id])
                if finish is not None and finish.kind == "eos_token":
                    break
                generated.append(step.token_id)
                if step.logprob is not None:
                    logprobs.append(step.logprob)
                text = ""
                if finish is None:
                    text, finish = stopper.feed_text(detok.add(step.token_id))
                pieces.append(text)
                yield GenerateEvent(text, step.token_id, step.logprob, time.perf_counter())
                if finish is not None:
                    break
                if step.context_full and len(generated) < options.max_new_tokens:
                    finish = FinishReason("length")
            if finish is None:
                finish = FinishReason("cancelled" if cancel is not None and cancel.is_set()
                                      else "max_tokens")
            if finish.kind in ("max_tokens", "length", "cancelled"):
                tail, _ = stopper.feed_text(detok.flush())
                tail += stopper.flush()
                if tail:
                    pieces.append(tail)
                    yield GenerateEvent(tail, None, None, time.perf_counter())
        finally:
            self.runner.reset()
        ended = time.perf_counter()
        timings = Timings(ttft_ms=clock.ttft_s * 1e3, prefill_tok_s=clock.prefill_tok_s,
                          decode_tok_s=clock.decode_tok_s, total_ms=(ended - started) * 1e3)
        result = GenerateResult(
            text="".join(pieces), token_ids=tuple(generated), finish_reason=finish,
            prompt_tokens=len(prompt), timings=timings, logprobs=tuple(logprobs))
        yield GenerateEvent("", None, None, ended, result=result)

    def fim_request(
        self, prefix: str, suffix: str, options: GenerateOptions | None = None, *,
        order: FimOrder = "psm", extra_files: Sequence[FimFile] = (),
        repo_name: str | None = None, file_path: str | None = None,
    ) -> GenerateRequest:
        """A fill-in-the-middle request in the model's own layout; FIM tokens stop it.

        Raises UnsupportedModelError when the model has no FIM tokens.
        """
        family = require_fim(self.tokenizer)
        ids = build_fim_ids(self.tokenizer, family, prefix, suffix, order=order,
                            extra_files=extra_files, repo_name=repo_name, file_path=file_path)
        options = options or GenerateOptions()
        if options.eos_token_ids is None:
            stops = dict.fromkeys([*self.eos_token_ids, *fim_stop_token_ids(family)])
            options = replace(options, eos_token_ids=tuple(stops))
        return GenerateRequest(token_ids=tuple(ids), options=options)

    def generate(self, request: GenerateRequest,
                 cancel: threading.Event | None = None) -> GenerateResult:
        for event in self.stream(request, cancel):
            if event.result is not None:
                return event.result
        raise AssertionError("stream ended without a result")

    def describe(self) -> Mapping[str, object]:
        return {"model": str(self.model.path), "provider": self.provider,
                "threads": self.session_info.threads, "decode_path": self.decode_path,
                "context_length": self.context_length}


def messages_from_pairs(pairs: Sequence[tuple[str, str]]) -> tuple[ChatMessage, ...]:
    return tuple(ChatMessage(role=role, content=content) for role, content in pairs)
