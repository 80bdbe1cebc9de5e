"""The JSON-schema subset of the JSON constraint, compiled to a small graph of nodes.

Understood: ``type`` (a name or a list of names: object, array, string, number, integer,
boolean, null), ``properties``, ``required``, ``additionalProperties`` (false when absent:
an object holds only its listed properties; true or a schema opens it), ``items``,
``enum``, ``const`` and ``anyOf`` whose branches have different types (``Optional[X]``).
Without ``type``, ``properties`` / ``required`` / ``additionalProperties`` imply an object
and ``items`` an array; otherwise any value. ``integer`` means digits only (no fraction
or exponent). ``enum`` / ``const`` values match their compact JSON text
(``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``).

Annotations are ignored (``title``, ``description``, ``default``, ``examples``,
``format`` -- an annotation unless a validator opts in --, ``$schema``, ``$id``,
``$comment``, ``deprecated``, ``readOnly``, ``writeOnly``). Any other keyword is refused
with an :class:`InvalidOptionError` that names it and where it is.

Compiled nodes are cached by the schema's canonical text, so equal schemas share nodes
(and with them the constraint's per-state caches).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidOptionError

if TYPE_CHECKING:
    from engine.config import JsonConstraintSpec

__all__ = ["ANY", "Node", "ObjectSpec", "compile_spec", "encode_name", "literal_text"]

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
SUPPORTED = frozenset({"type", "properties", "required", "additionalProperties", "items",
                       "enum", "const", "anyOf"})
IGNORED = frozenset({"title", "description", "default", "examples", "format", "$schema",
                     "$id", "$comment", "deprecated", "readOnly", "writeOnly"})
MAX_SCHEMA_DEPTH = 32
_CACHE_SIZE = 64
_HINT = ("supported: " + ", ".join(sorted(SUPPORTED)) + "; annotations such as title and "
         "description are ignored")


class ObjectSpec:
    """The keys an object may hold. Names are kept in their JSON-encoded form (the text
    between the quotes), as the model writes them."""

    __slots__ = ("additional", "names", "properties", "required")

    def __init__(self, properties: Mapping[str, Node], required: frozenset[str],
                 additional: Node | None) -> None:
        self.properties = dict(properties)
        self.required = required
        #: The value schema of keys not in ``properties``; None = no other keys.
        self.additional = additional
        self.names = tuple(sorted(self.properties))


class Node:
    """What one JSON value may be. Identity-hashed: states refer to nodes cheaply."""

    __slots__ = ("boolean", "integer", "items", "literals", "null", "number", "obj", "string")

    def __init__(self, *, obj: ObjectSpec | None = None, items: Node | None = None,
                 string: bool = False, number: bool = False, integer: bool = False,
                 boolean: bool = False, null: bool = False,
                 literals: tuple[str, ...] | None = None) -> None:
        self.obj = obj
        self.items = items
        self.string = string
        self.number = number
        #: Integers only (``number`` is False then).
        self.integer = integer
        self.boolean = boolean
        self.null = null
        #: enum / const: the value must be one of these JSON texts (nothing else applies).
        self.literals = literals

    def categories(self) -> set[str]:
        found = {name for name, on in (("object", self.obj is not None),
                                       ("array", self.items is not None),
                                       ("string", self.string),
                                       ("number", self.number or self.integer),
                                       ("boolean", self.boolean), ("null", self.null)) if on}
        return found


def _any() -> Node:
    node = Node(string=True, number=True, boolean=True, null=True)
    node.obj = ObjectSpec({}, frozenset(), node)
    node.items = node
    return node


#: Any JSON value (objects with any keys, arrays of anything).
ANY = _any()
#: Any JSON object.
ANY_OBJECT = Node(obj=ANY.obj)


def encode_name(name: str) -> str:
    """A key as it appears between its quotes in JSON text."""
    return json.dumps(name, ensure_ascii=False)[1:-1]


def literal_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _error(path: str, message: str, hint: str = _HINT) -> InvalidOptionError:
    return InvalidOptionError("constraint", f"{message} (at {path})", hint=hint)


def _types(schema: Mapping[str, Any], path: str) -> set[str]:
    raw = schema.get("type")
    if raw is None:
        if any(k in schema for k in ("properties", "required", "additionalProperties")):
            return {"object"}
        return {"array"} if "items" in schema else set(TYPES)
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _error(path + ".type", f"type must be a name or a non-empty list of names, "
                     f"got {raw!r}", hint="one of " + ", ".join(TYPES))
    bad = [n for n in names if n not in TYPES]
    if bad:
        raise _error(path + ".type", f"unknown type {bad[0]!r}", hint="one of " + ", ".join(TYPES))
    return set(names)


def _literals(schema: Mapping[str, Any], path: str) -> tuple[str, ...]:
    if "const" in schema:
        values = [schema["const"]]
    else:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise _error(path + ".enum", f"enum must be a non-empty list, got {values!r}",
                         hint='e.g. "enum": ["red", "green"]')
    try:
        return tuple(dict.fromkeys(literal_text(v) for v in values))
    except ValueError as exc:
        raise _error(path, f"enum/const value is not JSON: {exc}") from exc


def _object(schema: Mapping[str, Any], path: str, depth: int) -> ObjectSpec:
    props = schema.get("properties", {})
    if not isinstance(props, Mapping):
        raise _error(path + ".properties", "properties must be an object of schemas")
    extra = schema.get("additionalProperties", False)
    additional: Node | None
    if extra is False:
        additional = None
    elif extra is True:
        additional = ANY
    else:
        additional = _compile(extra, path + ".additionalProperties", depth + 1)
    nodes = {encode_name(str(name)): _compile(sub, f"{path}.properties.{name}", depth + 1)
             for name, sub in props.items()}
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _error(path + ".required", f"required must be a list of names, got {required!r}")
    for name in required:
        if encode_name(name) not in nodes:
            if additional is None:
                raise _error(path + ".required", f"{name!r} is required but not in properties "
                             "and additionalProperties is false",
                             hint="add it to properties, or allow additionalProperties")
            nodes[encode_name(name)] = additional
    return ObjectSpec(nodes, frozenset(encode_name(r) for r in required), additional)


def _as_literals(node: Node, path: str) -> tuple[str, ...]:
    if node.literals is not None:
        return node.literals
    if node.categories() <= {"boolean", "null"}:
        return (("true", "false") if node.boolean else ()) + (("null",) if node.null else ())
    raise _error(path, "anyOf mixes enum/const branches with string, number, object or "
                 "array branches", hint="use one enum listing every allowed value")


def _union(branches: list[Node], path: str) -> Node:
    if any(b.literals is not None for b in branches):
        texts = [t for b in branches for t in _as_literals(b, path)]
        return Node(literals=tuple(dict.fromkeys(texts)))
    seen: set[str] = set()
    for branch in branches:
        overlap = seen & branch.categories()
        if overlap:
            raise _error(path, f"anyOf branches overlap on type {sorted(overlap)[0]!r}",
                         hint="anyOf is supported when each branch has a different type")
        seen |= branch.categories()
    merged = Node()
    for b in branches:
        merged.obj = merged.obj or b.obj
        merged.items = merged.items or b.items
        merged.string |= b.string
        merged.number |= b.number
        merged.integer |= b.integer
        merged.boolean |= b.boolean
        merged.null |= b.null
    return merged


def _compile(schema: Any, path: str, depth: int) -> Node:
    if depth > MAX_SCHEMA_DEPTH:
        raise _error(path, f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels",
                     hint="flatten the schema")
    if schema is True:
        return ANY
    if not isinstance(schema, Mapping):
        raise _error(path, f"a schema must be an object (or true), got {schema!r}",
                     hint='e.g. {"type": "string"}')
    for key in schema:
        if key not in SUPPORTED and key not in IGNORED:
            raise _error(path, f"unsupported JSON-schema keyword {key!r}")
    if "anyOf" in schema:
        others = [k for k in schema if k in SUPPORTED and k != "anyOf"]
        if others:
            raise _error(path, f"anyOf cannot be combined with {others[0]!r} here",
                         hint="move the keyword into each anyOf branch")
        branches = schema["anyOf"]
        if not isinstance(branches, list) or not branches:
            raise _error(path + ".anyOf", "anyOf must be a non-empty list of schemas")
        return _union([_compile(b, f"{path}.anyOf[{i}]", depth + 1)
                       for i, b in enumerate(branches)], path)
    if "const" in schema or "enum" in schema:
        return Node(literals=_literals(schema, path))
    types = _types(schema, path)
    node = Node(string="string" in types, number="number" in types,
                integer="integer" in types and "number" not in types,
                boolean="boolean" in types, null="null" in types)
    if "object" in types:
        node.obj = _object(schema, path, depth)
    if "array" in types:
        node.items = _compile(schema["items"], path + ".items", depth + 1) \
            if "items" in schema else ANY
    return node


_cache: OrderedDict[tuple[str, str, bool], Node] = OrderedDict()
_lock = threading.Lock()


def compile_spec(spec: JsonConstraintSpec) -> Node:
    """The root node of ``spec`` (cached by canonical text); raises InvalidOptionError."""
    text = json.dumps(spec.schema, sort_keys=True) if spec.schema is not None else ""
    key = (spec.kind, text, spec.object_only)
    with _lock:
        cached = _cache.get(key)
        if cached is not None:
            _cache.move_to_end(key)
            return cached
    if spec.kind == "json_object":
        node = ANY_OBJECT if spec.object_only else ANY
    else:
        node = _compile(spec.schema, "schema", 0)
    with _lock:
        _cache[key] = node
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return node
