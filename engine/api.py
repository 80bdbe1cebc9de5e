"""Requests, results and stream events: the engine's boundary types."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from engine.config import GenerateOptions
from engine.errors import InvalidOptionError, InvalidPromptError

# --- the small types the layers below fill in (the token loop, the sampler, the chat
# template) and a request or a result carries: they live here, at the bottom, so that
# the boundary imports nothing above it.


@dataclass(frozen=True)
class ChatMessage:
    """One chat turn; ``apply_chat_template`` also accepts plain mappings."""

    role: str
    content: str


FinishKind = Literal["max_tokens", "eos_token", "stop_sequence", "length", "cancelled",
                     "json_complete"]


@dataclass(frozen=True)
class FinishReason:
    kind: FinishKind
    #: Index into ``options.stop_sequences`` when ``kind == "stop_sequence"``.
    stop_index: int | None = None

    def __post_init__(self) -> None:
        assert (self.kind == "stop_sequence") == (self.stop_index is not None), self

    def __str__(self) -> str:
        return f"stop_sequence({self.stop_index})" if self.kind == "stop_sequence" else self.kind



@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    #: The best alternatives as (token id, logprob), most likely first; never -inf ones.
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class SamplerContext:
    """What a custom sampler sees besides the logits."""

    prompt_ids: tuple[int, ...]
    #: The tokens generated so far in this request.
    generated_ids: tuple[int, ...]
    #: 0 for the first generated token, then 1, 2, ...
    step: int


#: A request's own token choice: ``(processed logits, context) -> token id``. It runs
#: after the processor chain (penalties, bias, masks, temperature, truncation: masked
#: tokens are -inf) and replaces the built-in sampler; it gets its own copy of the logits.
CustomSampler = Callable[[np.ndarray, SamplerContext], int]


@dataclass
class SpeculativeStats:
    proposed: int = 0
    accepted: int = 0
    forwards: int = 0
    tokens: int = 0
    #: Seconds spent in the proposer (what speculation costs when nothing matches).
    propose_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"proposed": self.proposed, "accepted": self.accepted,
                "forwards": self.forwards, "tokens": self.tokens,
                "acceptance_rate": round(self.acceptance_rate, 4),
                "tokens_per_forward": round(self.tokens_per_forward, 4),
                "propose_ms": round(self.propose_s * 1e3, 3)}


@dataclass(frozen=True)
class GenerateRequest:
    """Exactly one of `prompt` (raw text, special tokens parsed), `messages` (chat
    template applied) or `token_ids`.

    `sampler` picks each token instead of the built-in samplers (see
    ``engine.sampling.CustomSampler``); it turns speculation off for the request.
    """

    prompt: str | None = None
    messages: tuple[ChatMessage | Mapping[str, Any], ...] | None = None
    token_ids: tuple[int, ...] | None = None
    options: GenerateOptions = field(default_factory=GenerateOptions)
    sampler: CustomSampler | None = None
    #: The chat template's ``tools`` (OpenAI function objects; engine.text.tool_calls).
    tools: tuple[Mapping[str, Any], ...] | None = None
    #: More variables for the chat template, as Hugging Face's ``apply_chat_template``
    #: passes its keyword arguments (the worker sets ``tool_choice`` with tools).
    chat_template_kwargs: Mapping[str, Any] | None = None
    #: A reasoning model's thoughts (engine.text.reasoning): None splits them from the
    #: answer for chat messages; "open" / "closed" split them for a prompt given as ids
    #: that ends inside / outside a think tag (a chat turn continued from a session);
    #: "off" leaves the output as it came.
    thoughts: Literal["open", "closed", "off"] | None = None
    #: Text taken off the prompt's end that the first generated tokens spell again (token
    #: healing at a code completion's cursor, ``engine.generation.fim_plain``). It belongs to the
    #: prompt, not the answer: stop strings are matched only after it.
    healed: str = ""

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.prompt, self.messages, self.token_ids)]
        if sum(given) != 1:
            raise InvalidPromptError(
                "a request needs exactly one of prompt, messages or token_ids "
                f"({sum(given)} given)", hint="pass prompt='...' for raw text")
        if self.sampler is not None and not callable(self.sampler):
            raise InvalidOptionError("sampler", f"expected a callable (logits, context) -> "
                                     f"token id, got {type(self.sampler).__name__}",
                                     hint="pass a function, or None for the built-in sampler")


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
    #: Prompt tokens whose KV was reused instead of computed.
    prefix_cache_hit_len: int = 0
    #: Oldest prompt tokens dropped to fit the context (only with truncate_prompt).
    prompt_tokens_dropped: int = 0
    #: Proposed / accepted tokens when speculative decoding ran.
    speculation: SpeculativeStats | None = None
    #: A reasoning model's thoughts (``<think>…</think>``, tags left out); ``text`` is
    #: then the answer alone (engine.text.reasoning).
    thoughts: str = ""


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
    #: Thought text that became stable with this event (reasoning models; ``text`` is the
    #: answer's part).
    thought: str = ""
