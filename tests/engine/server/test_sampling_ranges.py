"""Sampling values outside their range are refused with a 400 that names the field and the
range, on every dialect, instead of being clamped silently or reaching the sampler (a
repetition penalty of 0 divided by zero there). What real clients send still passes
(tests/engine/server/test_clients.py sends the captured requests whole)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.server.live import LiveServer

MESSAGES = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 2},
    "/v1/completions": {"prompt": "def f(", "max_tokens": 2},
    "/completion": {"prompt": "def f(", "n_predict": 2},
    "/infill": {"input_prefix": "def f(", "input_suffix": ")\n", "n_predict": 2},
    "/api/generate": {"prompt": "def f(", "stream": False, "options": {"num_predict": 2}},
    "/api/chat": {"messages": MESSAGES, "stream": False, "options": {"num_predict": 2}},
}
OPENAI = ("/v1/chat/completions", "/v1/completions")
LLAMA = ("/completion", "/infill")
OLLAMA = ("/api/generate", "/api/chat")

#: (routes, field, value, words the message must have)
BAD = [
    (OPENAI, "temperature", -0.5, "0 to 100"),
    (OPENAI, "temperature", 101, "0 to 100"),
    (OPENAI, "top_p", 1.5, "0 to 1"),
    (OPENAI, "min_p", -0.1, "0 to 1"),
    (OPENAI, "top_k", -2, "-1 or more"),
    (OPENAI, "repetition_penalty", 0, "0.01 to 100"),
    (OPENAI, "repetition_penalty", 1e-30, "0.01 to 100"),
    (OPENAI, "max_tokens", 0, "1 or more"),
    (("/v1/chat/completions",), "max_completion_tokens", -3, "1 or more"),
    (LLAMA, "temperature", -1, "0 to 100"),
    (LLAMA, "top_p", 1.5, "0 to 1"),
    (LLAMA, "min_p", 2, "0 to 1"),
    (LLAMA, "top_k", -5, "-1 or more"),
    (LLAMA, "repeat_penalty", 0, "0.01 to 100"),
    (LLAMA, "repeat_penalty", 1000, "0.01 to 100"),
    (LLAMA, "n_predict", -5, "-1 or more"),
    (OLLAMA, "options.temperature", -1, "0 to 100"),
    (OLLAMA, "options.top_p", 1.5, "0 to 1"),
    (OLLAMA, "options.min_p", -1, "0 to 1"),
    (OLLAMA, "options.top_k", -3, "-1 or more"),
    (OLLAMA, "options.repeat_penalty", 0, "0.01 to 100"),
    (OLLAMA, "options.num_predict", -3, "-2 or more"),
    (OLLAMA, "options.num_predict", 0, "-2 or more but 0"),
]
CASES = [(route, field, value, words) for routes, field, value, words in BAD
         for route in routes]


def _with(body: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    body = {**body, "options": dict(body.get("options", {}))} if "options" in body else {**body}
    if field.startswith("options."):
        body["options"][field.split(".", 1)[1]] = value
    else:
        body[field] = value
    return body


def _message(route: str, answer: dict[str, Any]) -> str:
    error = answer["error"]
    return error if isinstance(error, str) else error["message"]


@pytest.mark.parametrize("route, field, value, words", CASES,
                         ids=[f"{r}-{f}={v}" for r, f, v, _ in CASES])
def test_a_value_out_of_range_is_refused_naming_field_and_range(server: LiveServer, route,
                                                                 field, value, words):
    with server.client() as http:
        response = http.post(route, json=_with(ROUTES[route], field, value))
    assert response.status_code == 400, response.text
    message = _message(route, response.json())
    assert message.startswith(f"{field}: ") and words in message, message
    if route in OPENAI:
        assert response.json()["error"]["param"] == field


#: The edges of each range, and what editors and their clients send (llama.vim's warm-up
#: n_predict 0 and temperature 0, Continue's 0.01, vLLM's top_k -1, Ollama's -1 / -2).
GOOD = [
    (OPENAI, {"temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0,
              "repetition_penalty": 1.1}),
    (OPENAI, {"temperature": 0.01, "top_p": 0, "top_k": 0, "repetition_penalty": 100}),
    (LLAMA, {"temperature": 0.0, "top_k": 40, "top_p": 0.9, "min_p": 1.0,
             "repeat_penalty": 0.01}),
    (LLAMA, {"temperature": 100, "top_k": -1, "top_p": 0.0, "n_predict": -1}),
    (OLLAMA, {"options.temperature": 0.01, "options.top_p": 1.0, "options.top_k": -1,
              "options.repeat_penalty": 1.1, "options.num_predict": -1}),
    (OLLAMA, {"options.temperature": 0, "options.num_predict": -2}),
]


@pytest.mark.parametrize("routes, fields", GOOD)
def test_values_within_range_and_what_clients_send_are_answered(server: LiveServer, routes,
                                                                fields):
    for route in routes:
        body = ROUTES[route]
        for field, value in fields.items():
            body = _with(body, field, value)
        if route in OLLAMA and body["options"].get("num_predict", 0) < 0:
            body["options"]["num_ctx"] = 64  # "no limit" ends at this context
        with server.client() as http:
            response = http.post(route, json=body)
        assert response.status_code == 200, (route, response.text)
    with server.client() as http:  # llama.vim's cache warm-up
        assert http.post("/infill", json={**ROUTES["/infill"], "n_predict": 0,
                                          "temperature": 0.0}).status_code == 200
