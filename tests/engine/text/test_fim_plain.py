"""engine.generation.fim_plain: code completion on a model without FIM tokens, through the engine.

The model is a forged one whose vocabulary has no FIM tokens and whose logits follow a
script (tests/engine/scripted_model.py): each test says what the model wants at each
step, e.g. a line break first, as a small model does after a line break.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest, GenerateResult
from engine.generation.fim_plain import (
    PREFIX_ONLY,
    FimLines,
    PrefixOnlyRequest,
    build_prefix_only_ids,
    clip_prefix,
    fim_layout,
    resolve_lines,
)
from engine.text.fim import detect_fim_family
from engine.text.tokenizer import Tokenizer
from tests.engine.scripted_model import FIRST, SECOND, Scenario, write_scripted_model

GREEDY = GenerateOptions(temperature=0.0, max_new_tokens=24)

SCENARIOS = {
    # a blank line at the cursor: the model's first choice is another line break
    # (the cursor starts a line: the line break before it is healed, so the model's first
    # token spells it again, as it would in a file where "\n" merges with what follows)
    "newline_first": Scenario("import os\n", "\nprint(x)\n",
                              ("\n", {"\n": FIRST, "x": SECOND}, " =", " ", "1", "\n", "\n",
                               "\n")),
    # mid-line: the suffix closes the bracket, and the model wants to close it at once
    "mid_line": Scenario("x = foo(", ")\n", ({")": FIRST, "a": SECOND}, ",", " b", ")", "\n")),
    # a block: ends at the dedent, where the engine stops generating
    "dedent": Scenario("def area(r):\n", "\n", ("\n", "   ", " return", " a", "\n", "x",
                                                 " =", " ", "1", "\n", "y", " =")),
    # the suffix's next line, reproduced, ends the answer
    "suffix_line": Scenario("def area(r):\n", "\n    return a\n",
                            ("\n", "   ", " ", "y", " =", " ", "1", "\n", "   ", " return",
                             " a", "\n")),
    # the blank after "return" is healed: the first token must spell it
    "healed": Scenario("def area(r):\n    return ", "\n\nprint(area(2))\n",
                       ({"x": FIRST, " a": SECOND}, "\n", "\n")),
}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Engine, dict[str, Scenario]]:
    folder = tmp_path_factory.mktemp("scripted") / "no-fim"
    placed = write_scripted_model(folder, list(SCENARIOS.values()))
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1))
    return engine, dict(zip(SCENARIOS, placed, strict=True))


def _answer(scripted: tuple[Engine, dict[str, Scenario]], name: str,
            lines: FimLines = "auto") -> tuple[GenerateRequest, GenerateResult]:
    engine, scenarios = scripted
    scenario = scenarios[name]
    request = engine.fim_request(scenario.prefix, scenario.suffix, GREEDY, lines=lines)
    return request, engine.generate(request)


def test_a_model_without_fim_tokens_gets_the_prefix_only_layout(scripted):
    engine, scenarios = scripted
    scenario = scenarios["newline_first"]
    request = engine.fim_request(scenario.prefix, scenario.suffix, GREEDY)
    assert isinstance(request, PrefixOnlyRequest) and engine.fim_family is None
    assert fim_layout(engine.fim_family, engine.tokenizer) == PREFIX_ONLY
    # the prompt is the code before the cursor and nothing else, but the line break the
    # cursor's line starts with (healed: the answer's first token spells it)
    assert scenario.prefix.endswith("\n") and request.rules is not None
    assert request.rules.heal == "\n"
    assert list(request.token_ids or ()) == engine.tokenizer.encode(scenario.prefix[:-1],
                                                                    parse_special=False)


def test_never_an_empty_line_when_the_first_choice_is_a_line_break(scripted):
    every: tuple[FimLines, ...] = ("auto", "single", "multi")
    for lines in every:
        _, result = _answer(scripted, "newline_first", lines=lines)
        assert result.text == "x = 1", lines


def test_mid_line_is_one_line_without_the_brackets_the_suffix_has(scripted):
    request, result = _answer(scripted, "mid_line")
    assert isinstance(request, PrefixOnlyRequest) and request.rules is not None
    assert not request.rules.multiline
    # the model wanted ")" first (masked: the suffix has it), then ")" again (cut)
    assert result.text == "a, b" and result.finish_reason.kind == "eos_token"


def test_a_block_ends_at_the_dedent_and_generation_stops_there(scripted):
    _, result = _answer(scripted, "dedent")
    assert result.text == "    return a"
    # stopped at the dedent's first visible token, not at max_new_tokens (the first of the
    # six tokens is the healed line break)
    assert len(result.token_ids) == 6 and result.finish_reason.kind == "eos_token"
    _, single = _answer(scripted, "dedent", lines="single")
    assert single.text == "    return a" and len(single.token_ids) == 5  # its line break


def test_the_suffix_next_line_reproduced_ends_the_answer(scripted):
    _, result = _answer(scripted, "suffix_line")
    assert result.text == "    y = 1"


def test_the_blank_before_the_cursor_is_healed_not_repeated(scripted):
    engine, scenarios = scripted
    scenario = scenarios["healed"]
    request, result = _answer(scripted, "healed")
    prompt = engine.tokenizer.decode(request.token_ids or ())
    assert scenario.prefix.endswith(" ") and prompt == scenario.prefix[:-1]
    # the model wanted "x" (no blank); the first token had to spell the blank: " a"
    assert result.text == "a"


def test_streamed_events_carry_only_the_trimmed_answer(scripted):
    engine, scenarios = scripted
    scenario = scenarios["mid_line"]
    events = list(engine.stream(engine.fim_request(scenario.prefix, scenario.suffix, GREEDY)))
    result = events[-1].result
    assert result is not None
    assert "".join(e.text for e in events[:-1]) == result.text == "a, b"
    assert all(")" not in e.text for e in events)


def test_models_with_fim_tokens_keep_their_layout(genai_model_dir: Path):
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    request = engine.fim_request("def f(", ")\n", GREEDY)
    assert not isinstance(request, PrefixOnlyRequest) and request.sampler is None
    assert engine.tokenizer.token_to_id("<|fim_middle|>") == (request.token_ids or ())[-1]
    assert fim_layout(detect_fim_family(engine.tokenizer), engine.tokenizer) == "psm"


# --- the prompt, without a model -------------------------------------------------------


def _bos_tokenizer(folder: Path) -> Tokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["import os\nx = 1\ndef f(a):\n    return a\n"] * 20, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 0)])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return Tokenizer.from_dir(folder)


def test_bos_first_when_the_tokenizer_adds_one(tmp_path):
    tokenizer = _bos_tokenizer(tmp_path / "bos")
    ids, heal = build_prefix_only_ids(tokenizer, "x = 1\n", budget=64)
    assert ids == [0, *tokenizer.encode("x = 1", parse_special=False)] and heal == "\n"
    ids, heal = build_prefix_only_ids(tokenizer, "x = (", budget=64)
    assert ids == [0, *tokenizer.encode("x = (", parse_special=False)] and heal == ""
    assert build_prefix_only_ids(tokenizer, "", budget=64)[0] == [0]


def test_a_long_prefix_is_clipped_at_line_boundaries_keeping_the_header(scripted):
    tokenizer = scripted[0].tokenizer
    header = "import os\nimport re\n\n"
    body = "".join(f"value_{i} = {i}\n" for i in range(80))
    prefix = header + body + "print("
    ids = clip_prefix(tokenizer, prefix, 120)
    text = tokenizer.decode(ids)
    assert len(ids) <= 120 and text.startswith(header) and text.endswith("value_79 = 79\nprint(")
    kept = text[len(header):]
    assert kept.startswith("value_") and body.endswith(kept[:-len("print(")])  # whole lines
    assert clip_prefix(tokenizer, "x = 1\n", 120) == tokenizer.encode("x = 1\n")


def test_single_or_multi_line(scripted):
    assert resolve_lines("auto", ")\n", GREEDY) is False  # mid-line
    assert resolve_lines("auto", "\n    return 1\n", GREEDY) is True
    stop_at_line_end = GenerateOptions(stop_sequences=("\n",))
    assert resolve_lines("auto", "\n", stop_at_line_end) is False
    assert resolve_lines("multi", ")\n", GREEDY) is True
    with pytest.raises(Exception, match="lines"):
        resolve_lines("sideways", "", GREEDY)
