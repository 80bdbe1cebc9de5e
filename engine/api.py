"""Requests, results and stream events: the engine's boundary types."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.config import GenerateOptions
from engine.errors import InvalidOptionError, InvalidPromptError
from engine.generation.sampling import CustomSampler, TokenLogprob
from engine.generation.speculative import SpeculativeStats
from engine.generation.stopping import FinishReason
from engine.text.tokenizer import ChatMessage


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
