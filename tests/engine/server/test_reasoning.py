"""A forged reasoning model (a Qwen3-like template that opens ``<think>`` in the prompt)
scripted to think, close the tag and answer: the thoughts come back as
``reasoning_content`` (OpenAI, streamed as ``delta.reasoning_content``) and ``thinking``
(Ollama), apart from the answer, and stop strings see the answer only."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.text.tokenizer import Tokenizer
from tests.engine.scripted_model import make_table, script_model
from tests.engine.server.live import LiveServer, serve, write_model
from tests.forge import ForgeSpec
from tests.forge.tokenizer import EOS_TOKEN_ID, set_chat_template

MODEL = "thinker"
#: Qwen3's generation prompt, reduced to what matters here: the tag opened in the prompt,
#: or an empty thought when ``enable_thinking`` is false.
TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}")
ASK: Any = [{"role": "user", "content": "What is two plus two?"}]
THOUGHT = "The user asks for two plus two. That is four."
SCRIPT = f"{THOUGHT}\n</think>\n\nIt is four."
#: Asked without thinking (a longer question, so the scripts sit apart): the answer alone.
QUICK: Any = [{"role": "user", "content": "Quickly, without thinking it over at length or "
               "showing any work at all, and in as few words as you can manage to use: what "
               "is two plus two, and why is it that number rather than another one?"}]
PLAIN = "Four."


def _prompt_len(folder: Path, messages: Any, **kwargs: Any) -> int:
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1))
    return len(engine.encode_request(GenerateRequest(messages=tuple(messages), **kwargs)))


def forge_thinker(folder: Path) -> Path:
    """The scripted reasoning model at ``folder`` (also used by tools/screenshots.py)."""
    folder = set_chat_template(write_model(folder, ForgeSpec(context=512)), TEMPLATE)
    tokenizer = Tokenizer.from_dir(folder)
    thinking = _prompt_len(folder, ASK)
    plain = _prompt_len(folder, QUICK, chat_template_kwargs={"enable_thinking": False})
    script = tokenizer.encode(SCRIPT, parse_special=False) + [EOS_TOKEN_ID]
    assert plain >= thinking + len(script), "the two scripts would overlap"
    scripts = [(thinking, script),
               (plain, [*tokenizer.encode(PLAIN, parse_special=False), EOS_TOKEN_ID])]
    script_model(folder, make_table(512, ForgeSpec().vocab, scripts))
    return folder


@pytest.fixture(scope="module")
def thinker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return forge_thinker(tmp_path_factory.mktemp("thinker") / MODEL)


@pytest.fixture(scope="module")
def thinker(thinker_dir: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("served")
    live = serve(Path(shutil.copytree(thinker_dir, root / MODEL)), root)
    yield live
    live.stop()


def test_the_engine_keeps_the_thoughts_apart_from_the_answer(thinker_dir: Path):
    engine = Engine.load(thinker_dir, EngineConfig(intra_op_threads=1))
    result = engine.generate(GenerateRequest(messages=tuple(ASK)))
    assert result.thoughts == THOUGHT + "\n"
    assert result.text == "It is four."
    # a raw prompt is not a chat: its text is the model's output as it came
    raw = engine.generate(GenerateRequest(token_ids=tuple(engine.encode_request(
        GenerateRequest(messages=tuple(ASK))))))
    assert raw.thoughts == "" and raw.text == SCRIPT


def test_openai_reasoning_content_whole_and_streamed(thinker: LiveServer):
    client: Any = openai.OpenAI(base_url=thinker.url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=100)
    message = reply.choices[0].message
    assert message.content == "It is four."
    assert message.reasoning_content == THOUGHT + "\n"
    assert reply.choices[0].finish_reason == "stop"
    thoughts, answer = [], []
    for part in client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=100,
                                               stream=True):
        delta = part.choices[0].delta if part.choices else None
        if delta is not None:
            thoughts.append(getattr(delta, "reasoning_content", None) or "")
            answer.append(delta.content or "")
    assert "".join(thoughts) == THOUGHT + "\n" and "".join(answer) == "It is four."


def test_stop_strings_see_the_answer_not_the_thoughts(thinker: LiveServer):
    with thinker.client() as http:
        # "four" is in the thoughts first: the stop fires in the answer only
        body = http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": ASK, "max_tokens": 100, "stop": ["four"]}).json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == THOUGHT + "\n"
    assert message["content"] == "It is "
    assert body["choices"][0]["finish_reason"] == "stop"


def test_ollama_thinking_and_the_think_switch(thinker: LiveServer):
    client = ollama.Client(host=thinker.url)
    reply = client.chat(model=MODEL, messages=ASK, options={"num_predict": 100})
    assert reply.message.thinking == THOUGHT + "\n"
    assert reply.message.content == "It is four."
    streamed = list(client.chat(model=MODEL, messages=ASK, stream=True,
                                options={"num_predict": 100}))
    assert "".join(p.message.thinking or "" for p in streamed) == THOUGHT + "\n"
    assert "".join(p.message.content or "" for p in streamed) == "It is four."
    quick = client.chat(model=MODEL, messages=QUICK, think=False, options={"num_predict": 100})
    assert not quick.message.thinking and quick.message.content == PLAIN


def test_enable_thinking_false_through_chat_template_kwargs(thinker: LiveServer):
    with thinker.client() as http:
        body = http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": QUICK, "max_tokens": 100,
            "chat_template_kwargs": {"enable_thinking": False}}).json()
    message = body["choices"][0]["message"]
    assert message["content"] == PLAIN and "reasoning_content" not in message


def test_the_model_card_says_it_reasons_and_takes_a_think_switch(thinker: LiveServer):
    with thinker.client() as http:
        card = http.get("/v1/models").json()["data"][0]
    assert card["meta"]["reasoning"] == {"thoughts": True, "switch": True}


def test_a_chat_kept_as_a_session_splits_its_thoughts_too(thinker: LiveServer):
    with thinker.client() as http:
        for _ in range(2):  # the second turn reuses the whole prompt but its last token
            body = http.post("/v1/chat/completions", headers={"X-Session-Id": "thinking"},
                             json={"model": MODEL, "messages": ASK, "max_tokens": 100}).json()
            message = body["choices"][0]["message"]
            assert message["reasoning_content"] == THOUGHT + "\n"
            assert message["content"] == "It is four."


def test_thoughts_stay_apart_under_a_tool_calls_auto_grammar(thinker_dir: Path):
    """A tool call with ``tool_choice: auto`` lets free text come first: a reasoning
    model's thoughts are split there too, and the call parser sees the answer only."""
    from engine.generation.tool_grammar import tool_constraint
    from engine.text.tool_calls import check_tools, detect_syntax

    engine = Engine.load(thinker_dir, EngineConfig(intra_op_threads=1))
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}]
    spec = tool_constraint(detect_syntax(engine.tokenizer), check_tools(tools), mode="auto",
                           parallel=False)
    result = engine.generate(GenerateRequest(messages=tuple(ASK), options=GenerateOptions(
        constraint=spec, max_new_tokens=100)))
    assert (result.thoughts, result.text) == (THOUGHT + "\n", "It is four.")


def test_text_held_for_a_stop_string_is_kept_when_the_answer_ends(thinker_dir: Path):
    engine = Engine.load(thinker_dir, EngineConfig(intra_op_threads=1))
    result = engine.generate(GenerateRequest(messages=tuple(ASK), options=GenerateOptions(
        stop_sequences=("four.?",), max_new_tokens=100)))
    assert result.text == "It is four." and result.finish_reason.kind == "eos_token"
