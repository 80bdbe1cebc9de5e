"""The llguidance grammar of a tool call: the model's call syntax around a JSON object
whose ``name`` is one of the tools and whose arguments match that tool's ``parameters``.

- ``required`` (or one named function): the answer is calls only, the first at once;
- ``auto``: the answer is plain text (never containing the call marker), or text and then
  calls; once the marker is written the rest is held to the call syntax, so a call's
  arguments validate whichever way the model goes;
- ``parallel`` False: at most one call.

A call's arguments hold the declared parameters only: an object schema that lists
``properties`` without saying ``additionalProperties`` takes no others (as llama.cpp's
grammars do; a random or weak model otherwise invents keys without end).

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


def _rebase(value: Any, base: str) -> Any:
    """``value`` with its local ``$ref``s ("#/...") pointing below ``base``: a tool's
    parameters sit inside the call object, so "#" is no longer their root."""
    if isinstance(value, dict):
        return {k: (base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#")
                    else _rebase(v, base)) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebase(v, base) for v in value]
    return value


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")


def _closed(schema: Any) -> Any:
    """Objects that list their ``properties`` and say nothing of others take no others (as
    llama.cpp's grammars do): a call's arguments are the declared parameters. Subschemas
    of ``allOf`` are left as they are (closing each would refuse their union)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out \
            and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _closed(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(v) for v in out[key]]
    if isinstance(out.get("items"), dict):
        out["items"] = _closed(out["items"])
    return out


def call_schema(tools: Sequence[Tool], args_key: str, root: str = "#") -> dict[str, Any]:
    """One call object: ``{"name": <a tool>, args_key: <its arguments>}`` (``root``: where
    the object sits in the whole schema)."""
    many = len(tools) > 1
    options = [{"type": "object",
                "properties": {"name": {"const": t.name}, args_key: _rebase(
                    _closed(dict(t.parameters)),
                    f"{root}{f'/anyOf/{i}' if many else ''}/properties/{args_key}")},
                "required": ["name", args_key], "additionalProperties": False}
               for i, t in enumerate(tools)]
    schema: dict[str, Any] = {"anyOf": options} if many else options[0]
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
        array = {"type": "array", "items": call_schema(tools, syntax.args_key, "#/items"),
                 "minItems": 1,
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
                                                       parallel=parallel),
                          prose_first=mode == "auto")
