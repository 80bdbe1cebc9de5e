"""A forged Hermes-template model scripted to start a call on its own (``tool_choice``
auto): the text before the call stays content, and from the call marker on the
constraint holds the arguments to the tool's schema. The same model answers Ollama's
Python client ``chat(..., tools=[...])`` in Ollama's ``tool_calls`` shape."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import ollama
import openai
import pytest

from engine.text.tokenizer import Tokenizer
from tests.engine.scripted_model import make_table, script_model
from tests.engine.server.live import LiveServer, serve, write_model
from tests.forge import ForgeSpec
from tests.forge.tokenizer import HERMES_CHAT_TEMPLATE, set_chat_template

MODEL = "caller"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 10},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "description":
                                           "The weather in a city", "parameters": WEATHER}}]
#: Ollama's client keeps only type/description/enum/items of each property (it drops
#: maxLength and additionalProperties): enums keep a random model's arguments short.
PLACES = {"type": "object",
          "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"]}
OLLAMA_TOOLS: Any = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "parameters": PLACES}}]
OPENAI_ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]
#: Longer than the OpenAI question: the two scripts sit at different positions.
OLLAMA_ASK: Any = [{"role": "user", "content": "What will the weather be like in Paris this "
                                          "afternoon, and should I take an umbrella along? "
                                          "I will be walking around the city for hours."}]
OPENAI_SCRIPT = "Let me check. <tool_call>"
OLLAMA_SCRIPT = "<tool_call>"


def _prompt_lengths(live: LiveServer) -> tuple[int, int]:
    client: Any = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(model=MODEL, messages=OPENAI_ASK, tools=TOOLS,
                                           max_tokens=1, tool_choice="none")
    second = ollama.Client(host=live.url).chat(model=MODEL, messages=OLLAMA_ASK,
                                               tools=OLLAMA_TOOLS, options={"num_predict": 1})
    assert first.usage is not None and second.prompt_eval_count is not None
    return first.usage.prompt_tokens, second.prompt_eval_count


@pytest.fixture(scope="module")
def caller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The model, scripted at the prompt lengths it measured on an unscripted copy."""
    probe_root = tmp_path_factory.mktemp("probe")
    probe = set_chat_template(write_model(probe_root / MODEL, ForgeSpec(context=1024)),
                              HERMES_CHAT_TEMPLATE)
    live = serve(probe, probe_root)
    try:
        at_openai, at_ollama = _prompt_lengths(live)
    finally:
        live.stop()
    root = tmp_path_factory.mktemp("scripted")
    folder = Path(shutil.copytree(probe, root / MODEL))
    tokenizer = Tokenizer.from_dir(folder)
    scripts = [(at_openai, tokenizer.encode(OPENAI_SCRIPT, parse_special=False)),
               (at_ollama, tokenizer.encode(OLLAMA_SCRIPT, parse_special=False))]
    assert at_ollama > at_openai + len(scripts[0][1])
    script_model(folder, make_table(1024, ForgeSpec().vocab, scripts))
    live = serve(folder, root)
    yield live
    live.stop()


def test_auto_keeps_the_text_and_constrains_the_call(caller: LiveServer):
    client: Any = openai.OpenAI(base_url=caller.url + "/v1", api_key="unused", max_retries=0)
    for seed in range(8):
        reply = client.chat.completions.create(
            model=MODEL, messages=OPENAI_ASK, tools=TOOLS, seed=seed, temperature=1.0,
            max_tokens=120, parallel_tool_calls=False)
        choice = reply.choices[0]
        assert choice.message.content == "Let me check."
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_without_tools_the_script_is_just_text(caller: LiveServer):
    with caller.client() as http:
        reply = http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": OPENAI_ASK, "max_tokens": 24, "seed": 1,
            "tools": TOOLS, "tool_choice": "none"}).json()
    message = reply["choices"][0]["message"]
    assert "tool_calls" not in message
    assert message["content"].startswith("Let me check. <tool_call>")


def _check_calls(calls: Any) -> list[dict[str, Any]]:
    assert calls
    out = []
    for call in calls:
        assert call.function.name == "get_weather"
        assert isinstance(call.function.arguments, dict)  # Ollama: an object, not a string
        jsonschema.validate(dict(call.function.arguments), PLACES)
        out.append(dict(call.function.arguments))
    return out


def test_ollama_client_chat_with_tools(caller: LiveServer):
    client = ollama.Client(host=caller.url)
    reply = client.chat(model=MODEL, messages=OLLAMA_ASK, tools=OLLAMA_TOOLS,
                        options={"seed": 4, "num_predict": 200})
    arguments = _check_calls(reply.message.tool_calls)
    assert reply.message.content == ""
    # the same request streamed: each call arrives whole, in the same order
    streamed: list[Any] = []
    for part in client.chat(model=MODEL, messages=OLLAMA_ASK, tools=OLLAMA_TOOLS, stream=True,
                            options={"seed": 4, "num_predict": 200}):
        streamed += part.message.tool_calls or []
    assert _check_calls(streamed) == arguments
    # the second turn: the call and its result go back, the model answers in text
    history: Any = [*OLLAMA_ASK, reply.message,
               {"role": "tool", "tool_name": "get_weather", "content": "18 C and dry"}]
    final = client.chat(model=MODEL, messages=history, tools=OLLAMA_TOOLS,
                        options={"seed": 4, "num_predict": 6})
    assert final.done and (final.prompt_eval_count or 0) > (reply.prompt_eval_count or 0)
