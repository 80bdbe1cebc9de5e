"""Tool calling in the prompt: the tools a request declares, the call syntax a model speaks,
and the conversation (tools, assistant calls, tool results) as its chat template sees it.

The call syntax is chosen from the chat template and the tokenizer's tokens:

- ``hermes`` (Hermes, Qwen 2.5/3, SmolLM3...): ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``, one block per call, text allowed before the first;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
- ``llama3`` (Llama 3.1+ JSON calls): the answer is ``{"name": ..., "parameters": {...}}``
  (``<|python_tag|>`` first where the model emits it).

A template that uses ``tools`` receives them as Hugging Face passes them (the OpenAI
``{"type": "function", "function": {...}}`` objects; assistant ``tool_calls`` with their
arguments as objects; ``role: tool`` messages with ``tool_call_id`` and ``name``). A
template that does not gets the **generic layout** (docs/tool-calling.md): the tools go
into the system message with instructions to answer in the ``hermes`` syntax, earlier
calls become ``<tool_call>`` blocks of the assistant's text, tool results become a user
message of ``<tool_response>`` blocks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine.errors import InvalidOptionError, TokenizerError
from engine.text.tokenizer import Tokenizer

ToolFormat = Literal["hermes", "mistral", "llama3"]
Layout = Literal["template", "generic"]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_USES_TOOLS = re.compile(r"\btools\b")


class ToolError(InvalidOptionError):
    """A malformed tool: names the tool (its index and name) and the reason."""

    def __init__(self, index: int, name: str | None, reason: str, hint: str | None = None
                 ) -> None:
        super().__init__(f"tools[{index}]" + (f" ({name!r})" if name else ""), reason,
                         hint=hint)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    #: The JSON Schema of the arguments (an object schema).
    parameters: Mapping[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": json.loads(json.dumps(self.parameters))}}


@dataclass(frozen=True)
class CallSyntax:
    """How a model writes its calls (see the module docstring)."""

    format: ToolFormat
    layout: Layout
    #: Text that opens a call ("" for llama3 calls that start at ``{``).
    open: str
    #: Text that closes one call block ("" when none).
    close: str
    #: The key of the arguments object.
    args_key: str
    #: The markers' token ids where they are special tokens (never in the text).
    open_id: int | None = None
    close_id: int | None = None

    def describe(self) -> dict[str, str]:
        return {"format": self.format, "layout": self.layout}


def check_tools(raw: Sequence[Any] | None) -> tuple[Tool, ...]:
    """The tools of a request (OpenAI's ``{"type": "function", "function": {...}}`` or
    the bare function object); a malformed one is a :class:`ToolError`."""
    tools: list[Tool] = []
    seen: set[str] = set()
    for index, item in enumerate(raw or ()):
        if not isinstance(item, Mapping):
            raise ToolError(index, None, f"expected an object, got {type(item).__name__}",
                            hint='send {"type": "function", "function": {"name": ..., '
                            '"parameters": {...}}}')
        kind = item.get("type", "function")
        if kind != "function":
            raise ToolError(index, None, f"type must be 'function', got {kind!r}",
                            hint="only function tools are supported")
        fn = item.get("function", item)
        if not isinstance(fn, Mapping):
            raise ToolError(index, None, "function must be an object")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError(index, None, "the function has no name",
                            hint='give each tool "function": {"name": "..."}')
        if not _NAME.match(name):
            raise ToolError(index, name, "the name must be 1..64 letters, digits, '_', "
                            "'.' or '-'")
        if name in seen:
            raise ToolError(index, name, "two tools have this name",
                            hint="give each tool its own name")
        seen.add(name)
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise ToolError(index, name, "description must be a string")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise ToolError(index, name, f"parameters must be a JSON Schema object, got "
                            f"{type(params).__name__}",
                            hint='e.g. {"type": "object", "properties": {...}}')
        try:
            params = json.loads(json.dumps(params, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ToolError(index, name, f"parameters is not plain JSON: {exc}") from exc
        tools.append(Tool(name, description, params))
    return tuple(tools)


def detect_syntax(tokenizer: Tokenizer) -> CallSyntax:
    """The call syntax of the model: its template's own, else the generic layout."""
    source = tokenizer.chat_template_source or ""
    uses_tools = bool(_USES_TOOLS.search(source))
    layout: Layout = "template" if uses_tools else "generic"

    def special_id(text: str) -> int | None:
        token = tokenizer.token_to_id(text)
        return token if token is not None and token in tokenizer.special_token_ids else None

    if uses_tools and "[TOOL_CALLS]" in source:
        return CallSyntax("mistral", layout, "[TOOL_CALLS]", "", "arguments",
                          special_id("[TOOL_CALLS]"))
    if uses_tools and "<tool_call>" not in source and (
            "<|python_tag|>" in source or "ipython" in source):
        return CallSyntax("llama3", layout, "", "", "parameters",
                          special_id("<|python_tag|>"))
    return CallSyntax("hermes", layout, "<tool_call>", "</tool_call>", "arguments",
                      special_id("<tool_call>"), special_id("</tool_call>"))


def _arguments_object(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(message)
    if out.get("content") is None:
        out["content"] = ""
    calls = out.get("tool_calls")
    if calls:
        fixed = []
        for call in calls:
            call = dict(call)
            fn = dict(call.get("function") or {})
            fn["arguments"] = _arguments_object(fn.get("arguments"))
            call["function"] = fn
            call.setdefault("type", "function")
            fixed.append(call)
        out["tool_calls"] = fixed
    return out


GENERIC_INTRO = (
    "# Tools\n\n"
    "You can call the functions below. Each is a JSON object with its name, description and "
    "the JSON Schema of its arguments:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, answer with one block per call, each a JSON object of the "
    "function's name and its arguments:\n"
    "<tool_call>\n{{\"name\": \"<function name>\", \"arguments\": {{<arguments>}}}}\n"
    "</tool_call>\n"
    "The results come back in <tool_response> blocks. When no function is needed, "
    "answer in plain text.")


def generic_system_text(tools: Sequence[Tool]) -> str:
    """The generic layout's tools section of the system message."""
    lines = "\n".join(json.dumps({"name": t.name, "description": t.description,
                                  "parameters": t.parameters}, ensure_ascii=False)
                      for t in tools)
    return GENERIC_INTRO.format(tools=lines)


def call_text(name: str, arguments: Any) -> str:
    """One call in the hermes syntax (the generic layout's)."""
    args = _arguments_object(arguments)
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": args},
                                         ensure_ascii=False) + "\n</tool_call>")


def _generic_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]
                      ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    intro = generic_system_text(tools) if tools else ""
    rest = list(messages)
    if rest and rest[0].get("role") == "system":
        first = str(rest.pop(0).get("content") or "")
        out.append({"role": "system", "content": f"{first}\n\n{intro}" if intro else first})
    elif intro:
        out.append({"role": "system", "content": intro})
    for message in rest:
        role = message.get("role")
        content = str(message.get("content") or "")
        if role == "assistant" and message.get("tool_calls"):
            blocks = [call_text((c.get("function") or {}).get("name", ""),
                                (c.get("function") or {}).get("arguments"))
                      for c in message["tool_calls"]]
            content = "\n".join([content, *blocks] if content else blocks)
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
        else:
            out.append({"role": role, "content": content})
    for message in out:
        message.pop("tool_results", None)
    return out


def fold_system(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The system message moved to the start of the first user message, for templates
    that refuse a system role (the generic layout's fallback)."""
    out = [dict(m) for m in messages]
    if len(out) > 1 and out[0].get("role") == "system" and out[1].get("role") == "user":
        system = out.pop(0)
        out[0]["content"] = f"{system.get('content') or ''}\n\n{out[0].get('content') or ''}"
    return out


def prompt_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool],
                    syntax: CallSyntax) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and the ``tools`` variable the chat template renders."""
    if syntax.layout == "generic":
        return _generic_messages(messages, tools), None
    return ([_template_message(m) for m in messages],
            [t.as_openai() for t in tools] if tools else None)


@dataclass(frozen=True)
class ToolLayout:
    """A conversation with tools as a model's chat template will see it."""

    syntax: CallSyntax
    messages: list[dict[str, Any]]
    #: The template's ``tools`` variable (None: the generic layout, or no tools).
    template_tools: list[dict[str, Any]] | None


def lay_out(tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]],
            tools: Sequence[Tool]) -> ToolLayout:
    """The call syntax ``tokenizer``'s model speaks and the conversation laid out for it:
    its template's own tool layout, or the generic one, whose system turn goes to the start
    of the first user turn for a template that refuses a system role (as Gemma 2's and
    early Mistral's do)."""
    syntax = detect_syntax(tokenizer)
    shown, template_tools = prompt_messages(messages, tools, syntax)
    if syntax.layout == "generic" and shown and shown[0].get("role") == "system":
        shown = _system_or_folded(tokenizer, shown)
    return ToolLayout(syntax, shown, template_tools)


def _system_or_folded(tokenizer: Tokenizer, shown: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    try:
        tokenizer.apply_chat_template(shown)
    except TokenizerError:
        folded = fold_system(shown)
        try:
            tokenizer.apply_chat_template(folded)
        except TokenizerError:
            return shown  # the request's own error, reported when it runs
        return folded
    return shown
