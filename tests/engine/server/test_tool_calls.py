"""Tool calling through a live worker with the real ``openai`` client, on a forged model
whose chat template is Hermes-style (its own tool support) and on one whose template has
none (the generic layout). The forged model's weights are random: what it calls is noise,
but the constraint makes every call parse and its arguments validate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from engine.model.default_model import default_model_dir
from tests.engine.server.live import LiveServer, serve, write_model
from tests.forge import ForgeSpec
from tests.forge.tokenizer import HERMES_CHAT_TEMPLATE, set_chat_template

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather",
                                      "description": "The weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time",
                                      "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
MODEL = "hermes-chat"


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("tool-models")
    folder = set_chat_template(write_model(root / MODEL, ForgeSpec(context=1024)),
                               HERMES_CHAT_TEMPLATE)
    live = serve(folder, root)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def generic_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("generic-models")
    live = serve(write_model(root / "plain-chat", ForgeSpec(context=1024)), root)
    yield live
    live.stop()


def _client(server: LiveServer) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _valid(call: Any) -> dict[str, Any]:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_a_two_turn_exchange_calls_then_answers(hermes_server: LiveServer):
    client = _client(hermes_server)
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", seed=3,
        max_tokens=120, parallel_tool_calls=False)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    _valid(call)
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, dry"}]
    second = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", seed=3, max_tokens=16)
    answer = second.choices[0]
    assert answer.message.tool_calls is None
    assert isinstance(answer.message.content, str) and answer.message.content
    # the call and its result are in the second prompt
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20


def test_required_calls_validate_at_temperature_one_over_50_seeds(hermes_server):
    client = _client(hermes_server)
    names = set()
    for seed in range(50):
        reply = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", seed=seed,
            temperature=1.0, max_tokens=160, parallel_tool_calls=False)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice)
        assert len(choice.message.tool_calls) == 1
        _valid(choice.message.tool_calls[0])
        names.add(choice.message.tool_calls[0].function.name)
    assert names == {"get_weather", "get_time"}  # the model picks; both come up


def _streamed(client: Any, **kwargs: Any) -> tuple[str, list[dict[str, str]], str]:
    content, calls, finish = "", dict[int, dict[str, str]](), ""
    order: list[str] = []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                # the first delta of a call has its id and name
                assert delta.id and delta.function.name and delta.type == "function"
                calls[delta.index] = {"id": delta.id, "name": delta.function.name,
                                      "arguments": ""}
                order.append("name")
            else:
                assert delta.id is None and not delta.function.name
                order.append("arguments")
            calls[delta.index]["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    if calls:
        assert order[0] == "name" and order.count("arguments") >= 2
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", "auto",
                                    {"type": "function", "function": {"name": "get_time"}}])
def test_streamed_and_whole_answers_agree(hermes_server, choice):
    client = _client(hermes_server)
    for seed in (1, 2, 3):
        kwargs = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": choice,
                  "seed": seed, "max_tokens": 120}
        whole = client.chat.completions.create(**kwargs).choices[0]
        content, calls, finish = _streamed(client, **kwargs)
        assert finish == whole.finish_reason
        assert content == (whole.message.content or "")
        expected = [(c.function.name, c.function.arguments)
                    for c in whole.message.tool_calls or []]
        assert [(c["name"], c["arguments"]) for c in calls] == expected
        if choice != "auto":
            assert calls
        if isinstance(choice, dict):
            assert {c["name"] for c in calls} == {"get_time"}


def test_parallel_calls_off_means_one_call(hermes_server):
    client = _client(hermes_server)
    seen_many = False
    for seed in range(6):
        many = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", seed=seed,
            max_tokens=200).choices[0]
        seen_many |= len(many.message.tool_calls or []) > 1
        one = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", seed=seed,
            max_tokens=200, parallel_tool_calls=False).choices[0]
        assert len(one.message.tool_calls) == 1 and one.finish_reason == "tool_calls"
    assert seen_many  # a random model keeps calling when it may


@pytest.mark.parametrize(("tools", "says"), [
    ([{"type": "function", "function": {"parameters": WEATHER}}],
     "tools[0]: the function has no name"),
    ([TOOLS[0], {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}}],
     "tools[1] ('bad'): parameters: the JSON schema was refused by llguidance"),
    ([{"type": "function", "function": {"name": "x", "parameters": "no"}}],
     "tools[0] ('x'): parameters must be a JSON Schema object"),
])
def test_malformed_tools_are_a_400_naming_the_tool(hermes_server, tools, says):
    with hermes_server.client() as http:
        reply = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK,
                                                        "tools": tools})
        assert reply.status_code == 400, reply.text
        assert says in reply.json()["error"]["message"]
        ollama = http.post("/api/chat", json={"model": MODEL, "messages": ASK,
                                              "tools": tools, "stream": False})
        assert ollama.status_code == 400 and says in ollama.json()["error"]


@pytest.mark.parametrize(("body", "says"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice: no tool is named 'nope'"),
    ({"tool_choice": "always"}, "tool_choice: expected none, auto, required"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format: cannot be combined with tools"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"function": 3}]}]},
     "messages[1].tool_calls[0]"),
])
def test_bad_tool_requests_are_a_400(hermes_server, body, says):
    with hermes_server.client() as http:
        reply = http.post("/v1/chat/completions",
                          json={"model": MODEL, "messages": ASK, "tools": TOOLS, **body})
    assert reply.status_code == 400, reply.text
    assert says in reply.json()["error"]["message"]


def test_capabilities_say_tools_and_the_layout(hermes_server, generic_server):
    for server, layout in ((hermes_server, "template"), (generic_server, "generic")):
        with server.client() as http:
            card = http.get("/v1/models").json()["data"][0]["meta"]
            show = http.post("/api/show", json={"model": ""}).json()
        assert "tools" in card["capabilities"] and "tools" in show["capabilities"]
        assert card["tool_calls"] == show["tool_calls"] == {"format": "hermes",
                                                            "layout": layout}


def test_the_generic_layout_calls_too(generic_server):
    client = _client(generic_server)
    for seed in range(5):
        choice = client.chat.completions.create(
            model="plain-chat", messages=ASK, tools=TOOLS, tool_choice="required", seed=seed,
            max_tokens=160, parallel_tool_calls=False).choices[0]
        assert choice.finish_reason == "tool_calls"
        _valid(choice.message.tool_calls[0])
    with generic_server.client() as http:
        plain = http.post("/v1/chat/completions", json={
            "model": "plain-chat", "messages": ASK, "max_tokens": 1}).json()
        tooled = http.post("/v1/chat/completions", json={
            "model": "plain-chat", "messages": ASK, "max_tokens": 1, "tools": TOOLS}).json()
    # the tools went into the prompt (the generic system turn)
    assert tooled["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 100


def test_tool_results_render_without_tools(hermes_server: LiveServer):
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    with hermes_server.client() as http:
        reply = http.post("/v1/chat/completions", json={"model": MODEL, "messages": history,
                                                        "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] is not None


def _raw_stream(url: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines()
                if line.startswith("data: {")]


def test_stream_chunks_have_the_openai_tool_call_shape(hermes_server: LiveServer):
    events = _raw_stream(hermes_server.url + "/v1/chat/completions", {
        "model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required",
        "seed": 5, "max_tokens": 120, "stream": True, "parallel_tool_calls": False})
    deltas = [e["choices"][0]["delta"] for e in events]
    first = next(d["tool_calls"][0] for d in deltas if "tool_calls" in d)
    assert set(first) == {"index", "id", "type", "function"}
    assert first["function"]["arguments"] == "" and first["function"]["name"]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    joined = "".join(d["tool_calls"][0]["function"].get("arguments", "")
                     for d in deltas if "tool_calls" in d)
    jsonschema.validate(json.loads(joined), SCHEMAS[first["function"]["name"]])



def test_a_session_turn_with_tools_answers_as_a_plain_request(hermes_server: LiveServer):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required",
            "temperature": 0, "max_tokens": 120, "parallel_tool_calls": False}
    with hermes_server.client() as http:
        plain = http.post("/v1/chat/completions", json=body).json()
        kept = http.post("/v1/chat/completions", json=body,
                         headers={"X-Session-Id": "tools-1"}).json()
    calls = [c["function"] for c in plain["choices"][0]["message"]["tool_calls"]]
    assert calls == [c["function"] for c in kept["choices"][0]["message"]["tool_calls"]]
    assert kept["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]


def test_ollama_format_with_tools_is_a_400(hermes_server: LiveServer):
    with hermes_server.client() as http:
        reply = http.post("/api/chat", json={"model": MODEL, "messages": ASK, "tools": TOOLS,
                                             "format": "json", "stream": False})
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("format: cannot be combined with tools")


NO_SYSTEM_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
    "{%- endif %}{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_a_template_without_a_system_role_gets_the_tools_in_the_user_turn(
        tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("no-system")
    folder = set_chat_template(write_model(root / "strict", ForgeSpec(context=1024)),
                               NO_SYSTEM_TEMPLATE)
    live = serve(folder, root)
    try:
        with live.client() as http:
            plain = http.post("/v1/chat/completions", json={
                "model": "strict", "messages": ASK, "max_tokens": 1}).json()
            called = http.post("/v1/chat/completions", json={
                "model": "strict", "messages": ASK, "tools": TOOLS, "max_tokens": 160,
                "tool_choice": "required", "parallel_tool_calls": False, "seed": 2})
            refused = http.post("/v1/chat/completions", json={
                "model": "strict", "max_tokens": 1,
                "messages": [{"role": "system", "content": "x"}, *ASK]})
    finally:
        live.stop()
    assert called.status_code == 200, called.text
    body = called.json()
    assert body["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 100
    (call,) = body["choices"][0]["message"]["tool_calls"]
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        SCHEMAS[call["function"]["name"]])
    # without tools the template's own refusal stands
    assert refused.status_code == 400 and "System role not supported" in refused.text


def test_the_builtin_model_calls_in_the_generic_layout():
    """SmolLM2-135M-Instruct (no tool support in its template) at temperature 1: whatever
    it picks, the call parses and validates; given the result, it answers in text."""
    folder = default_model_dir()
    if folder is None:
        pytest.skip("the built-in model is not in this checkout")
    live = serve(folder, folder.parent)
    try:
        client = _client(live)
        assert client.models.list().data[0].meta["tool_calls"] == {"format": "hermes",
                                                                   "layout": "generic"}
        for seed in range(3):
            first = client.chat.completions.create(
                model="", messages=ASK, tools=TOOLS, tool_choice="required", seed=seed,
                temperature=1.0, max_tokens=120, parallel_tool_calls=False).choices[0]
            assert first.finish_reason == "tool_calls"
            (call,) = first.message.tool_calls
            _valid(call)
            history = [*ASK, first.message.model_dump(exclude_none=True),
                       {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
            second = client.chat.completions.create(
                model="", messages=history, tools=TOOLS, seed=seed, max_tokens=40).choices[0]
            assert second.message.content and not second.message.tool_calls
    finally:
        live.stop()


def test_a_template_that_reads_tool_choice_gets_it(tmp_path):
    """As Hugging Face's apply_chat_template passes it: a template that says more when a
    call is required shows it in the prompt the model reads (its token count)."""
    template = ("{%- if tool_choice == 'required' %}{{- '<|im_start|>system\\nYou must call "
                "one of the tools now.<|im_end|>\\n' }}{%- endif %}" + HERMES_CHAT_TEMPLATE)
    folder = set_chat_template(write_model(tmp_path / "choosy", ForgeSpec(context=1024)),
                               template)
    live = serve(folder, tmp_path)
    try:
        client = _client(live)
        counts = {}
        for choice in ("auto", "required", "none"):
            answer = client.chat.completions.create(
                model="choosy", messages=ASK, tools=TOOLS, tool_choice=choice, seed=1,
                max_tokens=40)
            counts[choice] = answer.usage.prompt_tokens
    finally:
        live.stop()
    assert counts["required"] > counts["auto"] == counts["none"]
