"""What the output must be: :class:`ConstraintSpec` and its llguidance grammar.

:func:`grammar_of` turns a spec into an llguidance grammar (cached by content; a grammar
llguidance refuses is an ``InvalidOptionError`` quoting its reason), so a bad schema fails
when the options are built, before any request runs. Following a request's tokens with the
grammar is ``engine.generation.guidance``'s job.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import llguidance
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from engine.errors import InvalidOptionError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

ConstraintKind = Literal["json_object", "json_schema", "grammar", "regex"]
_KINDS = ("json_object", "json_schema", "grammar", "regex")


@dataclass(frozen=True)
class ConstraintSpec:
    """What the output must be, compiled by llguidance (``engine.generation.guidance``):

    - ``json_object``: any JSON value (an object only when ``object_only``);
    - ``json_schema``: a value matching ``schema`` (JSON Schema as llguidance supports it:
      ``$ref``/``$defs``, ``oneOf``/``anyOf``/``allOf``, ``pattern``, numeric bounds,
      lengths, ``format``, ``enum``/``const``...);
    - ``grammar``: ``text`` is a GBNF (llama.cpp) or Lark grammar;
    - ``regex``: ``text`` is a regular expression the whole output matches.

    JSON is compact (no whitespace between tokens) unless the schema's ``x-guidance``
    says otherwise. The schema is copied; one llguidance refuses fails here with its
    reason."""

    kind: ConstraintKind = "json_object"
    schema: Mapping[str, Any] | None = None
    object_only: bool = False
    text: str | None = None
    #: The grammar lets free text come first (a tool call with ``tool_choice: auto``): a
    #: reasoning model's thoughts are kept apart from the answer under it too.
    prose_first: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidOptionError("constraint", f"kind must be one of {', '.join(_KINDS)}, "
                                     f"got {self.kind!r}",
                                     hint="use json_object for any JSON value")
        if self.kind != "json_schema" and self.schema is not None:
            raise InvalidOptionError("constraint", "a schema needs kind='json_schema'",
                                     hint="pass kind='json_schema' with the schema")
        if self.object_only and self.kind != "json_object":
            raise InvalidOptionError("constraint", "object_only applies to json_object",
                                     hint='say "type": "object" in the schema instead')
        if self.kind in ("grammar", "regex"):
            if not isinstance(self.text, str) or not self.text.strip():
                raise InvalidOptionError(
                    "constraint", f"kind={self.kind!r} needs its text, got {self.text!r}",
                    hint='e.g. ConstraintSpec("grammar", text=\'root ::= "yes" | "no"\')')
        elif self.text is not None:
            raise InvalidOptionError("constraint", f"text applies to grammar and regex, not "
                                     f"{self.kind}", hint="pass a schema instead")
        if self.kind == "json_schema":
            if not isinstance(self.schema, Mapping):
                raise InvalidOptionError(
                    "constraint", f"json_schema needs a schema object, got {self.schema!r}",
                    hint='e.g. {"type": "object", "properties": {...}}')
            try:  # a private copy: later changes to the caller's dict change nothing
                copied = json.loads(json.dumps(self.schema, allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise InvalidOptionError("constraint", f"the schema is not plain JSON: {exc}",
                                         hint="use dicts, lists, strings, numbers, "
                                         "booleans and null only") from exc
            object.__setattr__(self, "schema", copied)
        grammar_of(self)  # compiles (once, cached) and validates


#: The former name (JSON only); the same class.
JsonConstraintSpec = ConstraintSpec



#: Compact JSON unless a schema's own x-guidance says otherwise.
JSON_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": False}
_ANY_VALUE: dict[str, Any] = {}
_ANY_OBJECT: dict[str, Any] = {"type": "object"}

_GRAMMARS: dict[str, str] = {}
_GRAMMARS_LOCK = threading.Lock()
_GRAMMAR_CACHE_SIZE = 256


def _key(spec: ConstraintSpec) -> str:
    return json.dumps([spec.kind, spec.schema, spec.object_only, spec.text], sort_keys=True)


def _build(spec: ConstraintSpec) -> str:
    matcher = llguidance.LLMatcher
    if spec.kind == "json_object":
        return matcher.grammar_from_json_schema(
            _ANY_OBJECT if spec.object_only else _ANY_VALUE, defaults=JSON_DEFAULTS)
    if spec.kind == "json_schema":
        try:
            return matcher.grammar_from_json_schema(dict(spec.schema or {}),
                                                    defaults=JSON_DEFAULTS)
        except ValueError as exc:
            raise _refused(spec, str(exc)) from exc
    if spec.kind == "regex":
        return matcher.grammar_from_regex(spec.text or "")
    try:
        lark = any_to_lark(spec.text or "")
    except (GbnfToLarkError, Exception) as exc:  # its converter raises plain Exceptions too
        raise _refused(spec, str(exc)) from exc
    return matcher.grammar_from_lark(lark)


def _refused(spec: ConstraintSpec, reason: str) -> InvalidOptionError:
    what = {"json_object": "the JSON grammar", "json_schema": "the JSON schema",
            "grammar": "the grammar", "regex": "the regex"}[spec.kind]
    hint = {"json_schema": "fix or drop the keyword it names (llguidance's JSON Schema "
                           "support: $ref/$defs, oneOf/anyOf/allOf, pattern, bounds, "
                           "lengths, format, enum, const)",
            "grammar": "send GBNF (llama.cpp's grammar syntax, a root rule) or a Lark "
                       "grammar with a start rule",
            "regex": "send a regular expression the whole answer must match"}
    return InvalidOptionError("constraint", f"{what} was refused by llguidance: "
                              f"{reason.strip()}", hint=hint.get(spec.kind))


def grammar_of(spec: ConstraintSpec) -> str:
    """The llguidance grammar of ``spec`` (validated; cached by content)."""
    key = _key(spec)
    with _GRAMMARS_LOCK:
        found = _GRAMMARS.get(key)
    if found is not None:
        return found
    grammar = _build(spec)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise _refused(spec, error)
    with _GRAMMARS_LOCK:
        if len(_GRAMMARS) >= _GRAMMAR_CACHE_SIZE:
            _GRAMMARS.pop(next(iter(_GRAMMARS)))
        _GRAMMARS[key] = grammar
    return grammar
