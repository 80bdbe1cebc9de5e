"""Structured output through the worker: OpenAI ``response_format`` (real openai client,
Pydantic parse included), Ollama ``format``, llama.cpp ``json_schema``, ``grammar``
(GBNF) and ``regex``, all mapped onto the engine's llguidance constraint."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema_rs
import openai
import pydantic
import pytest

from engine import ChatMessage, Engine, GenerateOptions, GenerateRequest, JsonConstraintSpec
from tests.engine.server.live import MODEL_NAME, LiveServer

SMALL = {"type": "object",
         "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["a", "b", "c"]},
                        "ids": {"type": "array", "items": {"enum": [1, 2, 3]}}},
         "required": ["ok", "kind"]}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SMALL}}
MESSAGES = [{"role": "user", "content": "Reply in JSON."}]


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def bias(engine: Engine) -> dict[int, float]:
    """-4 on whitespace-only tokens: the random model favours them and would otherwise
    often run out of context inside the value (see tests/engine/generation/test_constraint.py)."""
    return {i: -4.0 for i, t in enumerate(engine.tokenizer.token_texts()) if t and not t.strip()}


def test_chat_json_schema_is_the_engines_constrained_answer(client, engine, bias):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=200, seed=7,
        logit_bias={str(k): v for k, v in bias.items()}, response_format=SCHEMA_FORMAT)
    text = reply.choices[0].message.content
    jsonschema_rs.validate(SMALL, json.loads(text))
    assert reply.choices[0].finish_reason == "stop"
    expected = engine.generate(GenerateRequest(
        messages=tuple(ChatMessage(m["role"], m["content"]) for m in MESSAGES),
        options=GenerateOptions(max_new_tokens=200, seed=7, logit_bias=bias,
                                constraint=JsonConstraintSpec("json_schema", SMALL))))
    assert text == expected.text


def test_chat_stream_with_json_schema_joins_to_valid_json(client, bias):
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=200, seed=3, stream=True,
        logit_bias={str(k): v for k, v in bias.items()}, response_format=SCHEMA_FORMAT)
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    jsonschema_rs.validate(SMALL, json.loads(text))
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_take_response_format_too(client, bias):
    reply = client.completions.create(
        model=MODEL_NAME, prompt="JSON:", max_tokens=200, seed=1,
        logit_bias={str(k): v for k, v in bias.items()},
        extra_body={"response_format": SCHEMA_FORMAT})
    jsonschema_rs.validate(SMALL, json.loads(reply.choices[0].text))
    # cut by max_tokens: as OpenAI answers, finish_reason "length" and the text so far
    cut = client.completions.create(model=MODEL_NAME, prompt="JSON:", max_tokens=2,
                                    extra_body={"response_format": {"type": "json_object"}})
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].text.startswith("{") and cut.usage.completion_tokens == 2


class Place(pydantic.BaseModel):
    city: Literal["Zürich", "東京", "Kraków"]
    population: int = pydantic.Field(ge=0, le=50_000_000)
    code: str = pydantic.Field(pattern=r"^[A-Z]{3}$")


class Trip(pydantic.BaseModel):
    stops: list[Place] = pydantic.Field(max_length=2)
    note: str | None = pydantic.Field(max_length=12)


def test_the_sdks_pydantic_parse_gets_a_valid_object(client):
    """``chat.completions.parse`` sends a strict schema with $defs/$ref, anyOf, bounds,
    a pattern and non-ASCII enum values; the answer parses into the model."""
    parsed = 0
    for seed in range(5):
        try:
            reply = client.chat.completions.parse(model=MODEL_NAME, messages=MESSAGES,
                                                  seed=seed, response_format=Trip)
        except openai.LengthFinishReasonError:  # the SDK's answer to "length"
            continue
        choice = reply.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Trip)
        parsed += 1
    assert parsed >= 2


def test_json_errors_are_4xx_answers_that_say_what_to_fix(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {
                    "type": "object", "unevaluatedProperties": False}}})
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "response_format"
    assert "llguidance" in body["message"] and "unevaluatedProperties" in body["message"]
    with pytest.raises(openai.BadRequestError, match="json_schema.schema"):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES,
                                       response_format={"type": "json_schema"})
    with pytest.raises(openai.BadRequestError, match="json_object, json_schema"):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES,
                                       response_format={"type": "yaml"})
    cut = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2,
                                         response_format=SCHEMA_FORMAT)
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content


def test_response_format_regex_and_grammar(client):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=20, seed=4,
        response_format={"type": "regex", "regex": "[a-z]{2,5}@[a-z]{2,5}\\.(com|org)"})
    assert re.fullmatch(r"[a-z]{2,5}@[a-z]{2,5}\.(com|org)", reply.choices[0].message.content)
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=20, seed=4,
        response_format={"type": "grammar", "grammar": 'root ::= "yes" | "no"'})
    assert reply.choices[0].message.content in ("yes", "no")


def test_ollama_format_schema_and_json(server):
    options = {"seed": 5, "num_predict": 200}
    with server.client() as http:
        answer = http.post("/api/chat", json={
            "model": MODEL_NAME, "messages": MESSAGES, "stream": False, "format": SMALL,
            "options": options})
        assert answer.status_code == 200, answer.text
        jsonschema_rs.validate(SMALL, json.loads(answer.json()["message"]["content"]))
        assert answer.json()["done_reason"] == "stop"
        plain = http.post("/api/generate", json={
            "model": MODEL_NAME, "prompt": "JSON:", "raw": True, "stream": False,
            "format": "json", "options": {**options, "num_predict": 3}})
        assert plain.status_code == 200 and plain.json()["done_reason"] == "length"
        assert plain.json()["response"].startswith("{")
        bad = http.post("/api/generate", json={"model": MODEL_NAME, "prompt": "x",
                                               "format": "yaml"})
        assert bad.status_code == 400 and "format" in bad.json()["error"]


def test_llamacpp_completion_json_schema(server):
    with server.client() as http:
        response = http.post("/completion", json={
            "prompt": "JSON:", "n_predict": 200, "seed": 2, "json_schema": SMALL})
        assert response.status_code == 200, response.text
        body = response.json()
        jsonschema_rs.validate(SMALL, json.loads(body["content"]))
        assert body["stop_type"] == "eos"
        bad = http.post("/completion", json={"prompt": "x", "json_schema": {
            "type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}})
        assert bad.status_code == 400 and "nowhere" in bad.json()["error"]["message"]


def test_llamacpp_gbnf_grammar_and_regex(server):
    gbnf = 'root ::= item ("," item){0,2}\nitem ::= [a-c] [0-9]'
    with server.client() as http:
        for seed in range(3):
            body = http.post("/completion", json={"prompt": "x", "n_predict": 30,
                                                  "seed": seed, "grammar": gbnf}).json()
            assert re.fullmatch(r"[a-c][0-9](,[a-c][0-9]){0,2}", body["content"]), body
        body = http.post("/completion", json={"prompt": "x", "n_predict": 30, "seed": 1,
                                              "regex": "(true|false)!"}).json()
        assert body["content"] in ("true!", "false!") and body["stop_type"] == "eos"
        bad = http.post("/completion", json={"prompt": "x", "grammar": "root ::= undefined"})
        assert bad.status_code == 400 and "undefined" in bad.json()["error"]["message"]
        both = http.post("/completion", json={"prompt": "x", "grammar": gbnf, "regex": "a"})
        assert both.status_code == 400 and "one of" in both.json()["error"]["message"]
