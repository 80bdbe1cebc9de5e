"""Request bodies of every dialect, as pydantic models (they are the OpenAPI schema too).

Unknown fields are ignored. Fields a client may send but the worker cannot honour are
declared here and refused in the route with a message (never silently dropped when they
would change the answer). Bounds that protect the server (stop strings, their length)
live here; option values are checked by ``GenerateOptions``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

StopText = Annotated[str, Field(max_length=512)]
Stop = StopText | Annotated[list[StopText], Field(max_length=64)] | None
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
#: Single or multi-line code completion for models without FIM tokens (engine.fim_plain):
#: "auto" is one line when the cursor is mid-line or a stop string is "\n".
FimLinesField = Annotated[Literal["auto", "single", "multi"], Field(
    description="models without FIM tokens: 'single' ends the completion at the end of the "
    "line, 'multi' at a dedent or a blank line; 'auto': single when the cursor is mid-line "
    "or a stop string is a line break")]


class _Body(BaseModel):
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
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
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
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    response_format: ResponseFormat | None = None


class ChatCompletionRequest(_OpenAISampling):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: int | None = None
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
    n_predict: int = -1
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
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
    num_predict: int | None = None
    num_ctx: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: Annotated[list[StopText], Field(max_length=64)] | None = None
    repeat_penalty: float | None = None
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


class LimitsRequest(BaseModel):
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
