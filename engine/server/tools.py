"""Tool calling for the OpenAI and Ollama chat routes: the request's tools and choice ->
the prompt and the constraint (``chat_request``, the one call a route makes before it
submits); the answer -> ``tool_calls`` in each dialect's shape. The model-side text (the
call syntax a model's template speaks, the generic layout, the parser) is
engine/text/tool_calls.py and engine/text/tool_parse.py; the grammar,
engine/generation/tool_grammar.py.

- ``tool_choice``: ``"none"`` (tools shown, answer is text), ``"auto"`` (the default: text,
  or calls whose arguments are constrained once the call starts), ``"required"`` or
  ``{"type": "function", "function": {"name": ...}}`` (calls only, constrained from the
  first token). ``parallel_tool_calls: false``: at most one call.
- A ``response_format`` constraint with tools that may be called is refused (send one).
- OpenAI streams a call as its name first (with the id), then fragments of its arguments;
  the finish reason is ``"tool_calls"``. Ollama answers ``message.tool_calls`` with the
  arguments as an object (a streamed call arrives whole, as Ollama sends it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.api import ChatMessage, GenerateRequest
from engine.config import GenerateOptions
from engine.errors import InvalidOptionError
from engine.generation.tool_grammar import Mode, check_tool_schemas, tool_constraint
from engine.server.errors import ApiError
from engine.server.generation import Chunk
from engine.server.models import LoadedModel
from engine.text.tool_calls import (
    CallSyntax,
    Tool,
    check_tools,
    detect_syntax,
    lay_out,
)
from engine.text.tool_parse import (
    Arguments,
    CallEnd,
    CallParser,
    CallStart,
    Event,
    Text,
    parse_answer,
)


@dataclass(frozen=True)
class ToolPlan:
    syntax: CallSyntax
    tools: tuple[Tool, ...]
    #: None: ``tool_choice`` none (no calls parsed).
    max_calls: int | None
    parse: bool
    messages: tuple[Mapping[str, Any], ...]
    template_tools: tuple[Mapping[str, Any], ...] | None

    @property
    def call_limit(self) -> int | None:
        return self.max_calls if self.parse else 0

    def parser(self) -> CallParser:
        return CallParser(self.syntax, max_calls=self.call_limit)


def capabilities(model: LoadedModel) -> dict[str, str] | None:
    """``{"format", "layout"}`` of the model's tool calls (None without a chat template)."""
    tokenizer = model.engine.tokenizer
    return detect_syntax(tokenizer).describe() if tokenizer.has_chat_template else None


def _choice(choice: Any, tools: Sequence[Tool]) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ApiError(400, f"tool_choice: expected none, auto, required or a function, "
                           f"got {choice!r}", param="tool_choice")
        return choice, None
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if choice.get("type", "function") == "function" and isinstance(name, str):
            if name not in {t.name for t in tools}:
                raise ApiError(400, f"tool_choice: no tool is named {name!r}",
                               param="tool_choice",
                               hint="name one of the request's tools")
            return "required", name
    raise ApiError(400, "tool_choice: expected none, auto, required or "
                   '{"type": "function", "function": {"name": "..."}}', param="tool_choice")


def needs_plan(tools: Sequence[Any] | None, messages: Sequence[Mapping[str, Any]]) -> bool:
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def plan_tools(model: LoadedModel, raw_tools: Sequence[Any] | None, choice: Any,
               parallel: bool | None, messages: Sequence[Mapping[str, Any]]) -> ToolPlan:
    """Check the tools (400 naming a malformed one) and lay out the prompt."""
    try:
        tools = check_tools(raw_tools)
        check_tool_schemas(tools)
    except InvalidOptionError as exc:
        raise ApiError(400, exc.message, param="tools", code="invalid_value",
                       hint=exc.hint) from exc
    if not model.engine.tokenizer.has_chat_template:
        raise ApiError(400, "tools: this model has no chat template to show them in",
                       param="tools", hint="load a chat model, or send a raw prompt")
    mode, only = _choice(choice, tools)
    if mode != "none" and not tools:
        raise ApiError(400, f"tool_choice: {mode} needs tools", param="tool_choice")
    laid = lay_out(model.engine.tokenizer, messages, tools)
    plan = ToolPlan(laid.syntax, tools, None if parallel is not False else 1, mode != "none",
                    tuple(laid.messages),
                    tuple(laid.template_tools) if laid.template_tools else None)
    return plan if only is None else replace(
        plan, tools=tuple(t for t in tools if t.name == only))


def chat_request(model: LoadedModel, messages: Sequence[ChatMessage],
                 history: Sequence[Mapping[str, Any]], options: GenerateOptions, *,
                 tools: Sequence[Any] | None, choice: Any = None,
                 parallel: bool | None = None, format_param: str = "response_format",
                 template_kwargs: Mapping[str, Any] | None = None,
                 ) -> tuple[GenerateRequest, ToolPlan | None]:
    """The chat request a dialect submits, and its tool plan: the one call a chat route
    makes for tools. Without tools (and no calls in the history), ``messages`` as they came
    and no plan. With them: the tools checked (a 400 names a malformed one), the prompt
    laid out for the model (``history``, the messages with their calls in the OpenAI
    shape), ``tool_choice`` for a template that reads it, and the call constraint; the
    plan then parses the answer into calls."""
    if not needs_plan(tools, history):
        return GenerateRequest(messages=tuple(messages), options=options,
                               chat_template_kwargs=template_kwargs), None
    plan = plan_tools(model, tools, choice, parallel, history)
    merged = {**(template_kwargs or {}), **(template_choice(plan, choice) or {})}
    request = GenerateRequest(messages=plan.messages, tools=plan.template_tools,
                              chat_template_kwargs=merged or template_kwargs,
                              options=constrain(plan, options, choice, format_param))
    return request, plan


def template_choice(plan: ToolPlan, choice: Any) -> dict[str, Any] | None:
    """``tool_choice`` for a model's own template that takes tools (templates that read it
    get it as the request sent it; the generic layout has no use for it)."""
    if plan.template_tools is None or choice is None:
        return None
    return {"tool_choice": choice}


def constrain(plan: ToolPlan, options: GenerateOptions, choice: Any,
              format_param: str = "response_format") -> GenerateOptions:
    """The options with the call constraint (none for ``tool_choice: "none"``)."""
    if not plan.parse:
        return options
    if options.constraint is not None:
        raise ApiError(400, f"{format_param}: cannot be combined with tools the model may "
                       "call", param=format_param,
                       hint='send tool_choice: "none" to answer in the format, or drop '
                       f"{format_param}" if format_param == "response_format"
                       else f"drop {format_param} or the tools")
    mode: Mode = "required" if choice == "required" or isinstance(choice, Mapping) else "auto"
    try:
        spec = tool_constraint(plan.syntax, plan.tools, mode=mode,
                               parallel=plan.max_calls is None)
    except InvalidOptionError as exc:
        raise ApiError(400, f"tools: {exc.message}", param="tools", hint=exc.hint) from exc
    return replace(options, constraint=spec)


def parse_chunks(plan: ToolPlan, chunks: Sequence[Chunk]) -> tuple[str, tuple[CallEnd, ...]]:
    parsed = parse_answer(plan.syntax, [(c.text, c.token_id) for c in chunks],
                          max_calls=plan.call_limit)
    return parsed.content, parsed.calls


# --- OpenAI ------------------------------------------------------------------------------


def openai_calls(calls: Sequence[CallEnd]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def openai_deltas(events: Sequence[Event]) -> list[dict[str, Any]]:
    """Chat-completion chunk deltas of parser events."""
    out: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, Text):
            out.append({"content": event.text})
        elif isinstance(event, CallStart):
            out.append({"tool_calls": [{"index": event.index, "id": event.id,
                                        "type": "function",
                                        "function": {"name": event.name, "arguments": ""}}]})
        elif isinstance(event, Arguments):
            out.append({"tool_calls": [{"index": event.index,
                                        "function": {"arguments": event.text}}]})
    return out


def openai_history(messages: Sequence[Any], texts: Sequence[str]) -> list[dict[str, Any]]:
    """OpenAI messages (their text already joined) as dicts, tool fields kept."""
    out: list[dict[str, Any]] = []
    for m, text in zip(messages, texts, strict=True):
        entry: dict[str, Any] = {"role": m.role, "content": text}
        if m.tool_calls:
            entry["tool_calls"] = _checked_calls(m.tool_calls, f"messages[{len(out)}]")
        if m.tool_call_id is not None:
            entry["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            entry["name"] = m.name
        out.append(entry)
    return out


def _checked_calls(calls: Sequence[Any], where: str) -> list[dict[str, Any]]:
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"{where}.tool_calls[{j}]: expected {{\"function\": "
                           f"{{\"name\": ..., \"arguments\": ...}}}}", param="messages")
        arguments = fn.get("arguments", {})
        if not isinstance(arguments, (str, Mapping)):
            raise ApiError(400, f"{where}.tool_calls[{j}].function.arguments: expected a "
                           "JSON string or an object", param="messages")
        out.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": arguments}})
    return out


# --- Ollama ------------------------------------------------------------------------------


def _arguments(call: CallEnd) -> Any:
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {"value": value}


def ollama_calls(calls: Sequence[CallEnd]) -> list[dict[str, Any]]:
    """Complete calls only (Ollama's arguments are an object; a cut one has none)."""
    return [{"function": {"index": c.index, "name": c.name, "arguments": _arguments(c)}}
            for c in calls if c.complete]


def ollama_messages(events: Sequence[Event]) -> list[dict[str, Any]]:
    """Streamed ``message`` objects: text as it comes, each call once complete."""
    out: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, Text):
            out.append({"role": "assistant", "content": event.text})
        elif isinstance(event, CallEnd) and event.complete:
            out.append({"role": "assistant", "content": "",
                        "tool_calls": ollama_calls([event])})
    return out


def ollama_history(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI-shaped dicts (tool calls, ``tool_name``)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        entry: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            entry["tool_calls"] = _checked_calls(m.tool_calls, f"messages[{len(out)}]")
        if m.tool_name:
            entry["name"] = m.tool_name
        out.append(entry)
    return out
