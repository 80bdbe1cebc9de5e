"""Text in a request body is Unicode text. JSON may spell half of a UTF-16 surrogate pair
alone (``"\\ud800"``); the tokenizer cannot take such a string. Every string field of every
route's body (found in the worker's own OpenAPI schema, so a new field is covered as soon as
it exists) is sent with a lone surrogate: each answer is a 400 naming the field, never a
server error."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest

from engine.server.app import create_app
from engine.server.config import ServerConfig
from tests.engine.server.live import LiveServer

SCHEMA = create_app(ServerConfig()).openapi()
LONE = "ab\ud800cd"
MESSAGES = [{"role": "user", "content": "hi"}]
#: A valid body per route: each case below changes one field of it.
BASES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/chat/completions"): {"messages": MESSAGES, "max_tokens": 2},
    ("post", "/v1/completions"): {"prompt": "def f(", "max_tokens": 2},
    ("post", "/completion"): {"prompt": "def f(", "n_predict": 2},
    ("post", "/infill"): {"input_prefix": "def f(", "input_suffix": ")\n", "n_predict": 2},
    ("post", "/tokenize"): {"content": "hi"},
    ("post", "/detokenize"): {"tokens": [1]},
    ("post", "/apply-template"): {"messages": MESSAGES},
    ("post", "/api/show"): {"name": "qwen2.5-coder-1.5b"},
    ("post", "/api/generate"): {"prompt": "hi", "stream": False,
                                "options": {"num_predict": 2}},
    ("post", "/api/chat"): {"messages": MESSAGES, "stream": False,
                            "options": {"num_predict": 2}},
    ("post", "/v1/models/load"): {"model": "qwen2.5-coder-1.5b"},
    ("post", "/v1/models/unload"): {"model": "nothing-loaded-by-this-name"},
    ("put", "/v1/library/roots"): {"roots": ["/nonexistent"]},
    ("put", "/v1/limits"): {"vram": "auto"},
    # only ever sent with a lone surrogate in it here: refused before any download starts
    ("post", "/api/pull"): {"model": "nothing/such-repo", "stream": False},
}
Path = tuple[str | int, ...]


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMA["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _members(schema: dict[str, Any]) -> list[dict[str, Any]]:
    schema = _resolve(schema)
    options = schema.get("anyOf") or schema.get("oneOf")
    return [m for option in options for m in _members(option)] if options else [schema]


def _text_fields(schema: dict[str, Any], path: Path = ()) -> list[tuple[Path, Any]]:
    """(where, what to put there) for every place of ``schema`` that takes text: a string
    field, an item of a list of strings, a value or a key of a free-form object."""
    cases: list[tuple[Path, Any]] = []
    for member in _members(schema):
        kind = member.get("type")
        if kind == "string":
            cases.append((path, LONE))
        elif kind == "array" and member.get("items"):
            item = [m for m in _members(member["items"]) if m.get("type") in
                    ("string", "object", "array")]
            if item and item[0].get("type") == "string":
                cases.append((path, [LONE]))
            elif item:
                cases += _text_fields(item[0], (*path, 0))
        elif kind == "object" or "properties" in member:
            for name, sub in member.get("properties", {}).items():
                cases += _text_fields(sub, (*path, name))
            if not member.get("properties") and member.get("additionalProperties", True):
                cases += [(path, {"key": LONE}), (path, {LONE: 1})]
    unique: dict[str, tuple[Path, Any]] = {}
    for where, value in cases:
        unique.setdefault(json.dumps([where, value]), (where, value))
    return list(unique.values())


def _body(base: dict[str, Any], where: Path, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(base)
    node: Any = body
    for step, following in itertools.pairwise(where):
        fresh: Any = [] if isinstance(following, int) else {}
        if isinstance(step, int):
            if not node:
                node.append(fresh)
            elif not isinstance(node[step], type(fresh)):  # e.g. content: text -> parts
                node[step] = fresh
        elif not isinstance(node.get(step), type(fresh)):
            node[step] = fresh
        node = node[step]
    if isinstance(where[-1], int) and not node:
        node.append(value)
    else:
        node[where[-1]] = value
    return body


def _cases() -> list[tuple[str, str, Path, Any]]:
    cases = []
    for path, methods in SCHEMA["paths"].items():
        for method, operation in methods.items():
            if "requestBody" not in operation:
                continue
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            cases += [(method, path, where, value) for where, value in _text_fields(schema)]
    return cases


CASES = _cases()


def test_every_route_with_a_body_has_a_valid_base_and_text_fields():
    routes = {(m, p) for m, p, _, _ in CASES}
    assert routes <= set(BASES), routes - set(BASES)
    for route in ("/v1/chat/completions", "/v1/completions", "/completion", "/infill",
                  "/api/chat", "/tokenize", "/apply-template", "/api/generate"):
        assert ("post", route) in routes
    assert len(CASES) >= 60, len(CASES)


@pytest.mark.parametrize("method, route, where, value", CASES,
                         ids=[f"{m} {r} {'.'.join(map(str, w))}" for m, r, w, _ in CASES])
def test_a_lone_surrogate_in_any_text_field_is_a_400_naming_it(server: LiveServer, method,
                                                                route, where, value):
    body = _body(BASES[(method, route)], where, value)
    with server.admin() as http:  # the admin routes too
        response = http.request(method.upper(), route, content=json.dumps(body),
                                headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    names = [str(step) for step in where if isinstance(step, str)]
    assert all(name in message for name in names), (names, message)
    if isinstance(error, dict) and "param" in error:  # OpenAI's shape
        assert error["param"].startswith(names[0]), error
