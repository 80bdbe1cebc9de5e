"""Request bodies of every dialect, as pydantic models (they are the OpenAPI schema too).

Unknown fields are ignored. Fields a client may send but the worker cannot honour are
declared here and refused in the route with a message (never silently dropped when they
would change the answer). Bounds that protect the server (stop strings, their length) and
the sampling ranges (the same on every dialect) live here; ``GenerateOptions`` checks the
engine's options again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import JsonDict
from pydantic_core import PydanticCustomError


def _range_check(low: float, high: float | None, meaning: str,
                 refused: tuple[float, ...] = ()) -> Callable[[Any], Any]:
    """A validator refusing values outside [low, high] (and the ``refused`` ones) with a
    message that gives the range and what its special values mean, e.g. "expected 0 to 100
    (0: greedy), got -1"."""
    span = f"{low:g} or more" if high is None else f"{low:g} to {high:g}"
    span += "".join(f" but {value:g}" for value in refused)
    note = f" ({meaning})" if meaning else ""

    def check(value: Any) -> Any:
        number = float(value)
        if not math.isfinite(number) or number < low or (high is not None and number > high) \
                or number in refused:
            raise PydanticCustomError("out_of_range", "expected {span}{note}, got {value}",
                                      {"span": span, "note": note, "value": value})
        return value

    return check


def _bounds(low: float, high: float | None = None) -> JsonDict:
    """The range in the OpenAPI schema (the validator beside it gives the message)."""
    return {"minimum": low} if high is None else {"minimum": low, "maximum": high}


# Sampling ranges, the same on every dialect (a value outside them is a 400 naming the
# field and its range; the engine's GenerateOptions holds the same bounds).
Temperature = Annotated[float, AfterValidator(_range_check(0, 100, "0: greedy")),
                        Field(json_schema_extra=_bounds(0, 100))]
Probability = Annotated[float, AfterValidator(_range_check(0, 1, "")),
                        Field(json_schema_extra=_bounds(0, 1))]
#: -1 (vLLM's and llama.cpp's "off") or 0: every token.
TopK = Annotated[int, AfterValidator(_range_check(-1, None, "0 or -1: off")),
                 Field(json_schema_extra=_bounds(-1))]
RepeatPenalty = Annotated[float, AfterValidator(_range_check(
    0.01, 100, "1: off, above 1 discourages repeats")), Field(json_schema_extra=_bounds(0.01, 100))]
MaxTokens = Annotated[int, AfterValidator(_range_check(1, None, "")),
                      Field(json_schema_extra=_bounds(1))]
#: llama.cpp: -1 until the end of text or the context, 0 only fills the cache.
NPredict = Annotated[int, AfterValidator(_range_check(
    -1, None, "-1: no limit, 0: only read the prompt")), Field(json_schema_extra=_bounds(-1))]
#: Ollama: -1 no limit, -2 until the context is full (0 asks for nothing: refused).
NumPredict = Annotated[int, AfterValidator(_range_check(
    -2, None, "-1: no limit, -2: fill the context", refused=(0,))),
    Field(json_schema_extra=_bounds(-2))]

StopText = Annotated[str, Field(max_length=512)]
Stop = StopText | Annotated[list[StopText], Field(max_length=64)] | None
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
#: Single or multi-line code completion for models without FIM tokens (engine.fim_plain):
#: "auto" is one line when the cursor is mid-line or a stop string is "\n".
FimLinesField = Annotated[Literal["auto", "single", "multi"], Field(
    description="models without FIM tokens: 'single' ends the completion at the end of the "
    "line, 'multi' at a dedent or a blank line; 'auto': single when the cursor is mid-line "
    "or a stop string is a line break")]


def _surrogate_at(text: str) -> int | None:
    """Where ``text`` has a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but no
    character: the tokenizer cannot take it), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _find_surrogate(value: Any, path: str = "") -> tuple[str, str, int] | None:
    """The first lone surrogate in ``value`` (text, or text within lists and objects; a
    nested body model checks its own fields): (path within value, the text, index)."""
    if isinstance(value, str):
        at = _surrogate_at(value)
        return None if at is None else (path, value, at)
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _find_surrogate(item, f"{path}[{index}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for number, (key, item) in enumerate(value.items()):
            found = _find_surrogate(key, f"{path} key #{number}") if isinstance(key, str) \
                else None
            found = found or _find_surrogate(item, f"{path}.{key}")
            if found is not None:
                return found
    return None


class _Text(BaseModel):
    """Every request body: its text is Unicode text. JSON may spell half of a UTF-16
    surrogate pair alone (``"\\ud800"``); such a string is refused with a 400 naming the
    field, as a body of invalid UTF-8 bytes is."""

    @field_validator("*", mode="after")
    @classmethod
    def _no_lone_surrogates(cls, value: Any) -> Any:
        if isinstance(value, (int, float, bool, BaseModel)) or value is None:
            return value
        found = _find_surrogate(value)
        if found is not None:
            path, text, at = found
            where = f" at {path.lstrip('.').strip()}" if path else ""
            raise PydanticCustomError(
                "lone_surrogate",
                "text{where} has a lone surrogate {code} at character {at} (half of a UTF-16 "
                "pair, not a character); send the character itself or both halves of its pair",
                {"where": where, "code": f"\\u{ord(text[at]):04x}", "at": at})
        return value


class _Body(_Text):
    model_config = ConfigDict(extra="ignore")


# --- OpenAI ---------------------------------------------------------------------------


class ContentPart(_Body):
    type: str = "text"
    text: str | None = None


class ChatMessageIn(_Body):
    role: Annotated[str, Field(max_length=64)]
    content: str | list[ContentPart] | None = None
    #: An assistant turn's calls (OpenAI's shape; arguments a JSON string).
    tool_calls: list[dict[str, Any]] | None = None
    #: A ``tool`` message: the call it answers, and the function's name.
    tool_call_id: str | None = None
    name: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """``text``, ``json_object``, ``json_schema`` (with ``json_schema.schema``), or this
    worker's ``regex`` (with ``regex``) and ``grammar`` (GBNF or Lark, with ``grammar``)."""

    type: str = "text"
    json_schema: JsonSchemaFormat | None = None
    regex: str | None = None
    grammar: str | None = None


class _OpenAISampling(_Body):
    model: str = ""
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions llama.cpp and vLLM accept on these routes too.
    top_k: TopK | None = None
    min_p: Probability | None = None
    repetition_penalty: RepeatPenalty | None = None
    response_format: ResponseFormat | None = None


class ChatCompletionRequest(_OpenAISampling):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    #: none, auto, required, or {"type": "function", "function": {"name": ...}}.
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    #: More variables for the chat template (as vLLM and llama.cpp's server take them),
    #: e.g. ``{"enable_thinking": false}`` for Qwen3.
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_OpenAISampling):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] = ""
    suffix: str | None = None
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    fim_lines: FimLinesField = "auto"


# --- llama.cpp ------------------------------------------------------------------------


class InfillExtra(_Body):
    text: str = ""
    filename: str = ""
    time: float | None = None


class LlamaSampling(_Body):
    """The sampling and stopping fields /completion and /infill share."""

    model: str = ""
    n_predict: NPredict = -1
    temperature: Temperature | None = None
    top_k: TopK | None = None
    top_p: Probability | None = None
    min_p: Probability | None = None
    repeat_penalty: RepeatPenalty | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: Annotated[list[StopText], Field(max_length=64)] | None = None
    samplers: list[str] | str | None = None
    ignore_eos: bool = False
    logit_bias: dict[str, float] | list[list[Any]] | None = None
    n_probs: int = 0
    stream: bool = False
    return_tokens: bool = False
    cache_prompt: bool = True
    id_slot: int = -1
    t_max_prompt_ms: float | None = None
    t_max_predict_ms: float | None = None
    n_indent: int = 0
    response_fields: list[str] | None = None
    n_cmpl: int = 1
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    #: This worker's: the whole answer matches this regular expression.
    regex: str | None = None


class InfillRequest(LlamaSampling):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillExtra] = Field(default_factory=list)
    prompt: str = ""
    fim_lines: FimLinesField = "auto"


class LlamaCompletionRequest(LlamaSampling):
    prompt: str | list[TokenId] = ""


class TokenizeRequest(_Body):
    content: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[TokenId] = Field(default_factory=list)


class ApplyTemplateRequest(_Body):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]


# --- Ollama ---------------------------------------------------------------------------


class OllamaOptions(_Body):
    num_predict: NumPredict | None = None
    num_ctx: int | None = None
    temperature: Temperature | None = None
    top_k: TopK | None = None
    top_p: Probability | None = None
    min_p: Probability | None = None
    seed: int | None = None
    stop: Annotated[list[StopText], Field(max_length=64)] | None = None
    repeat_penalty: RepeatPenalty | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class OllamaShowRequest(_Body):
    model: str = ""
    name: str = ""


class OllamaGenerateRequest(_Body):
    model: str = ""
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    raw: bool = False
    stream: bool = True
    options: OllamaOptions | None = None
    format: str | dict[str, Any] | None = None
    images: list[str] | None = None
    keep_alive: str | int | float | None = None
    fim_lines: FimLinesField = "auto"


class OllamaChatMessage(_Body):
    role: Annotated[str, Field(max_length=64)]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    #: A ``tool`` message: the function whose result it is.
    tool_name: str | None = None


class OllamaChatRequest(_Body):
    model: str = ""
    #: Empty: load (or with ``keep_alive: 0`` unload) the model, as Ollama does.
    messages: list[OllamaChatMessage] = Field(default_factory=list)
    stream: bool = True
    options: OllamaOptions | None = None
    format: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    keep_alive: str | int | float | None = None
    #: Whether a reasoning model thinks first (its template's ``enable_thinking``).
    think: bool | None = None


# --- the app's own --------------------------------------------------------------------


class LoadModelRequest(_Body):
    model: Annotated[str, Field(min_length=1, max_length=4096)]
    #: Tokens of context to load with (a cap on the model's own); unset: the one its
    #: ``pull.json`` gives ("fits with a shorter context (N tokens)"), else the model's.
    context_length: Annotated[int, Field(ge=16, le=1 << 24)] | None = None


class LibraryRootsRequest(_Body):
    roots: Annotated[list[Annotated[str, Field(min_length=1, max_length=4096)]],
                     Field(max_length=256)]


class UnloadModelRequest(_Body):
    model: str = ""


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The OpenAI error shape (llama.cpp routes: code/message/type; Ollama: a string)."""

    error: ErrorDetail | str


LimitValue = Annotated[str, Field(max_length=64)] | int | float


class LimitsRequest(_Text):
    """One memory limit to change now. A value is ``auto``, a fraction of the tier's
    capacity (``0.5``), a percentage (``"50%"``), a size (``"8GiB"``, ``"512MiB"``,
    ``"8GB"``) or plain bytes (``8589934592``)."""

    model_config = ConfigDict(extra="forbid")

    vram: LimitValue | None = None
    host_ram: LimitValue | None = None
    disk: LimitValue | None = None


class OllamaPullRequest(_Body):
    model: str = ""
    name: str = ""
    insecure: bool = False
    stream: bool = True
