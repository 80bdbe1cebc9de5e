"""Tool calls without a server: the syntax a template speaks, the prompt it renders, the
answer parsed (whole and piece by piece), and the llguidance grammar that holds a call's
arguments to its tool's schema, on the forge's real tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest

from engine.errors import InvalidOptionError
from engine.generation.guidance import guidance_tokenizer
from engine.generation.tool_grammar import check_tool_schemas, tool_grammar
from engine.text.tokenizer import Tokenizer
from engine.text.tool_calls import (
    CallSyntax,
    ToolError,
    check_tools,
    detect_syntax,
    prompt_messages,
)
from engine.text.tool_parse import Arguments, CallParser, CallStart, Text, parse_answer
from tests.forge.tokenizer import HERMES_CHAT_TEMPLATE, set_chat_template

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city"]}
TOOLS = check_tools([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}])
HERMES = CallSyntax("hermes", "template", "<tool_call>", "</tool_call>", "arguments")
MISTRAL = CallSyntax("mistral", "template", "[TOOL_CALLS]", "", "arguments")
LLAMA = CallSyntax("llama3", "template", "", "", "parameters")
CALL1 = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
CALL2 = '{"name": "add", "arguments": {"a": 3}}'
ANSWERS = [
    (HERMES, f"Let me look.\n<tool_call>\n{CALL1}\n</tool_call>\n<tool_call>\n{CALL2}\n"
             "</tool_call>", "Let me look.", 2),
    (MISTRAL, f"[TOOL_CALLS][{CALL1}, {CALL2}]", "", 2),
    (LLAMA, CALL1.replace("arguments", "parameters"), "", 1),
    (HERMES, "No call here, only a <tool mention.", "No call here, only a <tool mention.", 0),
    (LLAMA, "Plain words {not a call}", "Plain words {not a call}", 0),
]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tokenizer_dir)


@pytest.fixture(scope="module")
def hermes_tokenizer(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> Tokenizer:
    folder = tmp_path_factory.mktemp("hermes-tok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tokenizer_dir / name).read_bytes())
    return Tokenizer.from_dir(set_chat_template(folder, HERMES_CHAT_TEMPLATE))


def test_syntax_comes_from_the_template(tokenizer, hermes_tokenizer):
    assert detect_syntax(hermes_tokenizer).describe() == {"format": "hermes",
                                                          "layout": "template"}
    assert detect_syntax(tokenizer).describe() == {"format": "hermes", "layout": "generic"}


@pytest.mark.parametrize(("raw", "says"), [
    ([{"type": "function", "function": {"parameters": {}}}], "tools[0]: the function has no name"),
    ([{"type": "function", "function": {"name": "a b"}}], "tools[0] ('a b'): the name"),
    ([{"function": {"name": "f"}}, {"function": {"name": "f"}}], "tools[1] ('f'): two tools"),
    ([{"type": "retrieval"}], "tools[0]: type must be 'function'"),
    ([{"function": {"name": "f", "parameters": []}}], "tools[0] ('f'): parameters must be"),
])
def test_malformed_tools_name_the_tool_and_the_reason(raw, says):
    with pytest.raises(ToolError, match=None) as caught:
        check_tools(raw)
    assert says in caught.value.message


def test_a_schema_llguidance_refuses_names_its_tool():
    tools = check_tools([{"function": {"name": "ok", "parameters": WEATHER}},
                         {"function": {"name": "bad", "parameters": {
                             "type": "object",
                             "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}}}])
    with pytest.raises(InvalidOptionError) as caught:
        check_tool_schemas(tools)
    assert caught.value.message.startswith("tools[1] ('bad'): parameters:")
    assert "look-around" in caught.value.message


def test_the_template_renders_tools_calls_and_results(hermes_tokenizer):
    messages: Any = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}]
    syntax = detect_syntax(hermes_tokenizer)
    shown, tools = prompt_messages(messages, TOOLS, syntax)
    text = hermes_tokenizer.apply_chat_template(shown, tools=tools)
    assert '"name": "get_weather", "description": "Weather now"' in text
    # the arguments string became an object, as Hugging Face templates expect
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' in text
    assert "<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_the_generic_layout_puts_tools_in_the_system_turn(tokenizer):
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "c", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C"}, {"role": "tool", "content": "dry"}]
    syntax = detect_syntax(tokenizer)
    shown, tools = prompt_messages(messages, TOOLS, syntax)
    assert tools is None
    text = tokenizer.apply_chat_template(shown)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '{"name": "add", "description": "", "parameters": {"type": "object"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>') in text
    assert ("<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n"
            "dry\n</tool_response><|im_end|>") in text


@pytest.mark.parametrize(("syntax", "answer", "content", "count"), ANSWERS)
def test_answers_parse_the_same_whole_and_streamed(syntax, answer, content, count):
    whole = parse_answer(syntax, [(answer, None)])
    streamed = parse_answer(syntax, [(ch, None) for ch in answer])
    assert whole.content == streamed.content == content
    assert len(whole.calls) == len(streamed.calls) == count
    for a, b in zip(whole.calls, streamed.calls, strict=True):
        assert (a.name, a.arguments, a.complete) == (b.name, b.arguments, True)
        assert isinstance(json.loads(a.arguments), dict)
    if count:
        assert json.loads(whole.calls[0].arguments) == {"city": "Paris", "unit": "c"}


def test_a_stream_names_the_call_before_its_arguments():
    parser = CallParser(HERMES)
    events = []
    for ch in f"Hi <tool_call>\n{CALL1}\n</tool_call>":
        events += parser.feed(ch)
    events += parser.finish()
    kinds = [type(e) for e in events]
    start = kinds.index(CallStart)
    assert all(k is Text for k in kinds[:start])
    assert "".join(e.text for e in events if isinstance(e, Arguments)) == \
        '{"city": "Paris", "unit": "c"}'
    assert kinds.index(Arguments) > start


def test_one_call_at_most_when_parallel_calls_are_off():
    answer = f"<tool_call>\n{CALL1}\n</tool_call>\n<tool_call>\n{CALL2}\n</tool_call>"
    parsed = parse_answer(HERMES, [(answer, None)], max_calls=1)
    assert [c.name for c in parsed.calls] == ["get_weather"]


def _matches(tokenizer: Tokenizer, grammar: str, text: str) -> bool:
    lltok = guidance_tokenizer(tokenizer, tokenizer.vocab_size)
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(grammar),
                                   log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    for token in tokenizer.encode(text, parse_special=False):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


@pytest.mark.parametrize(("syntax", "text", "auto", "required", "single"), [
    (HERMES, "Just text.", True, False, True),
    (HERMES, f"Sure. <tool_call>\n{CALL1}\n</tool_call>", True, False, True),
    (HERMES, f"<tool_call>\n{CALL1}\n</tool_call>", True, True, True),
    (HERMES, f"<tool_call>\n{CALL1}\n</tool_call>\n<tool_call>\n{CALL2}\n</tool_call>",
     True, True, False),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n'
             "</tool_call>", False, False, False),
    (HERMES, "text <tool_call> and more text", False, False, False),
    (MISTRAL, f"[TOOL_CALLS][{CALL1}]", True, True, True),
    (MISTRAL, f"[TOOL_CALLS][{CALL1}, {CALL2}]", True, True, False),
    (LLAMA, CALL1.replace("arguments", "parameters"), True, True, True),
    (LLAMA, "A plain answer.", True, False, True),
    (LLAMA, '{"name": "nope", "parameters": {}}', False, False, False),
])
def test_the_grammar_holds_calls_to_the_schema(tokenizer, syntax, text, auto, required,
                                               single):
    assert _matches(tokenizer, tool_grammar(syntax, TOOLS, mode="auto", parallel=True),
                    text) is auto
    assert _matches(tokenizer, tool_grammar(syntax, TOOLS, mode="required", parallel=True),
                    text) is required
    assert _matches(tokenizer, tool_grammar(syntax, TOOLS, mode="auto", parallel=False),
                    text) is (auto and single)


def test_local_refs_in_parameters_still_resolve(tokenizer):
    params = {"type": "object", "$defs": {"unit": {"enum": ["c", "f"]}},
              "properties": {"unit": {"$ref": "#/$defs/unit"}}, "required": ["unit"]}
    tools = check_tools([{"function": {"name": "a", "parameters": params}},
                         {"function": {"name": "b", "parameters": params}}])
    grammar = tool_grammar(HERMES, tools, mode="required", parallel=False)
    ok = '<tool_call>\n{"name": "b", "arguments": {"unit": "f"}}\n</tool_call>'
    assert _matches(tokenizer, grammar, ok)
    assert not _matches(tokenizer, grammar, ok.replace('"f"', '"k"'))


def test_arguments_hold_the_declared_parameters_only(tokenizer):
    base = {"type": "object", "properties": {"a": {"type": "integer"}}}
    extra = '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    closed = check_tools([{"function": {"name": "f", "parameters": base}}])
    opened = check_tools([{"function": {"name": "f", "parameters": {
        **base, "additionalProperties": True}}}])
    assert not _matches(tokenizer, tool_grammar(HERMES, closed, mode="required",
                                                parallel=False), extra)
    assert _matches(tokenizer, tool_grammar(HERMES, opened, mode="required", parallel=False),
                    extra)


def test_a_special_marker_counts_by_its_token_id():
    # the detokenizer drops special tokens: the marker arrives as an id with no text
    syntax = CallSyntax("mistral", "template", "[TOOL_CALLS]", "", "arguments", open_id=7)
    pieces: list[tuple[str, int | None]] = [("Checking.", 11), ("", 7)]
    pieces += [(ch, None) for ch in f"[{CALL1}]"]
    parsed = parse_answer(syntax, pieces)
    assert parsed.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"})]
    # without the id the same text is no call
    assert not parse_answer(syntax, [("Checking.", 11), (f"[{CALL1}]", None)]).calls
