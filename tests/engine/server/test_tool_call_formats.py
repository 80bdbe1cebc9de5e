"""The Mistral (``[TOOL_CALLS]``) and Llama 3 (JSON, ``<|python_tag|>``) call syntaxes
end to end: forged models whose templates speak them, with their markers as special
tokens (two of the forge's repo-level FIM tokens renamed). The constraint emits the
special marker (it is otherwise banned), the detokenizer drops it from the text, and the
parser still finds the calls by its token id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from engine.text.tokenizer import Tokenizer
from engine.text.tool_calls import check_tools, detect_syntax, prompt_messages
from tests.engine.server.live import LiveServer, serve, write_model
from tests.forge import ForgeSpec
from tests.forge.tokenizer import set_chat_template

MISTRAL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}[INST] "
    "{%- if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{%- endif %}{{ message.content }}[/INST]"
    "{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS]["
    "{%- for call in message.tool_calls %}{\"name\": \"{{ call.function.name }}\", "
    "\"arguments\": {{ call.function.arguments | tojson }}}"
    "{%- if not loop.last %}, {% endif %}{%- endfor %}]<|endoftext|>"
    "{%- elif message.role == 'tool' %}[TOOL_RESULTS]{{ message.content }}[/TOOL_RESULTS]"
    "{%- else %}{{ message.content }}<|endoftext|>{%- endif %}{%- endfor %}")
LLAMA_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nEnvironment: ipython\nCall a function with "
    "{\"name\": function name, \"parameters\": its arguments}:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.tool_calls %}<|python_tag|>{%- for call in message.tool_calls %}"
    "{\"name\": \"{{ call.function.name }}\", \"parameters\": "
    "{{ call.function.arguments | tojson }}}{%- endfor %}"
    "{%- else %}{{ message.content }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
#: Special tokens of the forge's vocabulary given the markers' names.
RENAMES = {"<|repo_name|>": "[TOOL_CALLS]", "<|file_sep|>": "<|python_tag|>"}
SCHEMA = {"type": "object",
          "properties": {"city": {"enum": ["Paris", "Rome"]},
                         "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"]}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "forecast",
                                                      "parameters": SCHEMA}}]
ASK: Any = [{"role": "user", "content": "Forecast for Paris?"}]


def _forge(folder: Path, template: str) -> Path:
    write_model(folder, ForgeSpec(context=1024))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = folder / name
        text = path.read_text(encoding="utf-8")
        for old, new in RENAMES.items():
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    return set_chat_template(folder, template)


@pytest.fixture(scope="module", params=["mistral", "llama3"])
def formatted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[str, LiveServer]]:
    root = tmp_path_factory.mktemp(request.param)
    template = MISTRAL_TEMPLATE if request.param == "mistral" else LLAMA_TEMPLATE
    live = serve(_forge(root / request.param, template), root)
    yield request.param, live
    live.stop()


def test_the_format_is_detected_and_calls_come_back(formatted):
    name, live = formatted
    with live.client() as http:
        card = http.get("/v1/models").json()["data"][0]["meta"]
    assert card["tool_calls"] == {"format": name, "layout": "template"}
    tokenizer = Tokenizer.from_dir(Path(card["path"]))
    syntax = detect_syntax(tokenizer)
    marker = "[TOOL_CALLS]" if name == "mistral" else "<|python_tag|>"
    assert syntax.open_id == tokenizer.token_to_id(marker)
    assert syntax.open_id in tokenizer.special_token_ids
    client: Any = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    for seed in range(10):
        kwargs: dict[str, Any] = {"model": name, "messages": ASK, "tools": TOOLS,
                                  "tool_choice": "required", "seed": seed,
                                  "max_tokens": 100, "parallel_tool_calls": False}
        whole = client.chat.completions.create(**kwargs).choices[0]
        assert whole.finish_reason == "tool_calls", whole
        (call,) = whole.message.tool_calls
        assert call.function.name == "forecast"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
        arguments = "".join(
            d.function.arguments or "" for chunk in client.chat.completions.create(
                stream=True, **kwargs) for d in chunk.choices[0].delta.tool_calls or [])
        assert arguments == call.function.arguments


def test_the_history_renders_in_the_format(formatted):
    name, live = formatted
    history: Any = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function",
        "function": {"name": "forecast", "arguments": '{"city": "Rome", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "user", "content": "And then?"}]
    with live.client() as http:
        reply = http.post("/v1/chat/completions", json={
            "model": name, "messages": history, "tools": TOOLS, "tool_choice": "none",
            "max_tokens": 3})
    assert reply.status_code == 200, reply.text
    tokenizer = Tokenizer.from_dir(_folder(live))
    syntax = detect_syntax(tokenizer)
    shown, tools = prompt_messages(history, check_tools(TOOLS), syntax)
    text = tokenizer.apply_chat_template(shown, tools=tools)
    if name == "mistral":
        assert '[TOOL_CALLS][{"name": "forecast", "arguments": {"city": "Rome", "days": 2}}]' \
            in text
        assert "[TOOL_RESULTS]rain[/TOOL_RESULTS]" in text
    else:
        assert '<|python_tag|>{"name": "forecast", "parameters": {"city": "Rome", "days": 2}}' \
            in text


def _folder(live: LiveServer) -> Path:
    return Path(live.config.model or "")
