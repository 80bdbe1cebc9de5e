"""The llguidance grammar of a tool call: the model's call syntax around a JSON object
whose ``name`` is one of the tools and whose arguments match that tool's ``parameters``.

- ``required`` (or one named function): the answer is calls only, the first at once;
- ``auto``: the answer is plain text (never containing the call marker), or text and then
  calls; once the marker is written the rest is held to the call syntax, so a call's
  arguments validate whichever way the model goes;
- ``parallel`` False: at most one call.

The JSON is compact with ``", "`` / ``": "`` separators (``json.dumps``' own, which the
models were trained on); a marker that is a special token is named by id (``<[id]>``),
which lets the constraint emit it (engine.guidance bans other special tokens).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from engine.config import ConstraintSpec
from engine.errors import InvalidOptionError
from engine.text.tool_calls import CallSyntax, Tool, ToolError

Mode = Literal["auto", "required"]

_JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def _lit(text: str) -> str:
    return json.dumps(text)


def call_schema(tools: Sequence[Tool], args_key: str) -> dict[str, Any]:
    """One call object: ``{"name": <a tool>, args_key: <its arguments>}``."""
    options = [{"type": "object",
                "properties": {"name": {"const": t.name}, args_key: dict(t.parameters)},
                "required": ["name", args_key], "additionalProperties": False}
               for t in tools]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": _JSON_STYLE}


def check_tool_schemas(tools: Sequence[Tool]) -> None:
    """Each tool's parameters compiled alone, so a refusal names its tool."""
    for index, tool in enumerate(tools):
        try:
            ConstraintSpec("json_schema", dict(tool.parameters))
        except InvalidOptionError as exc:
            reason = exc.message.split(": ", 1)[-1] if ": " in exc.message else exc.message
            raise ToolError(index, tool.name, f"parameters: {reason}",
                            hint=exc.hint) from exc


def _regex_text(text: str) -> str:
    return "".join("\\" + c if c in r".^$*+?()[]{}|\/" else c for c in text)


def tool_grammar(syntax: CallSyntax, tools: Sequence[Tool], *, mode: Mode,
                 parallel: bool) -> str:
    """The Lark grammar (llguidance's dialect) of an answer that may or must call."""
    if not tools:
        raise ValueError("a tool grammar needs at least one tool")
    one = json.dumps(call_schema(tools, syntax.args_key))
    marker = f"<[{syntax.open_id}]>" if syntax.open_id is not None else (
        _lit(syntax.open) if syntax.open else "")
    close = f"<[{syntax.close_id}]>" if syntax.close_id is not None else _lit(syntax.close)
    rules = [f"call: %json {one}"]
    if syntax.format == "mistral":
        array = {"type": "array", "items": json.loads(one), "minItems": 1,
                 **({} if parallel else {"maxItems": 1}), "x-guidance": _JSON_STYLE}
        rules = [f"calls: {marker} rest", f"rest: %json {json.dumps(array)}"]
    elif syntax.format == "llama3":
        more = ' (";" " " call)*' if parallel else ""
        rules += [f"calls: ({marker})? rest" if marker else "calls: rest", f"rest: call{more}"]
    else:
        body = f'"\\n" call "\\n" {close}'
        more = f' ("\\n" {marker} {body})*' if parallel else ""
        rules += [f"calls: {marker} rest", f"rest: {body}{more}"]
    if mode == "required":
        start = ["start: calls"]
    elif syntax.format == "llama3":
        # text never starts with "{" (a call does); a special marker is never text
        start = ["start: TEXT | calls",
                 r"TEXT: /(?s:\s*[^{\s].*)?/"]
    elif syntax.open_id is not None:
        start = ["start: TEXT | TEXT calls", "TEXT: /(?s:.*)/"]
    else:
        # text never holds the marker; a lazy head ends at the first one
        marker_re = _regex_text(syntax.open)
        start = ["start: TEXT | head rest",
                 f"TEXT: /(?s:.*)/ & ~/(?s:.*){marker_re}(?s:.*)/",
                 f"head[lazy]: /(?s:.*){marker_re}/"]
    return "\n".join(["%llguidance {}", *start, *rules]) + "\n"


def tool_constraint(syntax: CallSyntax, tools: Sequence[Tool], *, mode: Mode,
                    parallel: bool) -> ConstraintSpec:
    """The constraint of :func:`tool_grammar` (compiled and validated)."""
    return ConstraintSpec("grammar", text=tool_grammar(syntax, tools, mode=mode,
                                                       parallel=parallel))
