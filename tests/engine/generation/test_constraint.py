"""Constrained output on llguidance: specs (refusals quote llguidance's reason), the
matcher following ids, the processor, stop rules, and sampled generations at temperature
1.0 on a forged model (random weights: only the mask makes the answer valid) and on the
built-in model when it is there. Answers validate with the ``jsonschema`` library or
ended on a limit."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from engine import (
    ConstraintError,
    ConstraintSpec,
    Engine,
    EngineConfig,
    GenerateOptions,
    GenerateRequest,
    GenerateResult,
)
from engine.errors import InvalidOptionError
from engine.generation.guidance import TokenConstraint
from engine.generation.logits import ProcessorContext, apply_processors, make_logits_processors
from engine.generation.stopping import FinishReason, StopChecker
from engine.model.default_model import default_model_dir

ANY = ConstraintSpec()
OBJECT = ConstraintSpec(object_only=True)
LIMITS = ("max_tokens", "length")

#: What the issue names: $ref/$defs, oneOf, pattern, minimum/maximum, maxItems, a
#: non-ASCII enum (several byte-level tokens per character), lengths and allOf.
SCHEMAS: dict[str, dict[str, Any]] = {
    "ref_oneof": {
        "$defs": {"point": {"type": "object", "additionalProperties": False,
                            "properties": {"x": {"type": "integer", "minimum": -5,
                                                 "maximum": 5},
                                           "y": {"type": "integer", "minimum": 0,
                                                 "maximum": 9}},
                            "required": ["x", "y"]}},
        "type": "object", "additionalProperties": False,
        "properties": {"at": {"$ref": "#/$defs/point"},
                       "shape": {"oneOf": [{"const": "circle"},
                                           {"type": "integer", "minimum": 3, "maximum": 8}]}},
        "required": ["at", "shape"]},
    "pattern_items": {
        "type": "object", "additionalProperties": False,
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                "minItems": 1, "maxItems": 3},
                       "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["code", "tags", "score"]},
    "non_ascii_enum": {
        "type": "object", "additionalProperties": False,
        "properties": {"city": {"enum": ["Zürich", "São Paulo", "東京", "Kraków"]},
                       "ok": {"type": "boolean"}},
        "required": ["city", "ok"]},
    "all_of": {
        "allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                   "required": ["a"]},
                  {"properties": {"b": {"type": "string", "minLength": 2, "maxLength": 4}},
                   "required": ["b"]}]},
}


def schema(body: dict) -> ConstraintSpec:
    return ConstraintSpec("json_schema", body)


# --- specs --------------------------------------------------------------------------------


def test_specs_llguidance_refuses_quote_its_reason() -> None:
    with pytest.raises(InvalidOptionError, match=re.escape("unevaluatedProperties")):
        schema({"type": "object", "unevaluatedProperties": False})
    with pytest.raises(InvalidOptionError, match="does not exist"):
        schema({"$ref": "#/$defs/missing"})
    with pytest.raises(InvalidOptionError, match="unclosed character class"):
        ConstraintSpec("regex", text="[0-9")
    with pytest.raises(InvalidOptionError, match="grammar was refused"):
        ConstraintSpec("grammar", text='root ::= "a" undefined-rule')
    with pytest.raises(InvalidOptionError, match="kind must be one of"):
        ConstraintSpec("yaml")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="needs its text"):
        ConstraintSpec("regex")
    with pytest.raises(InvalidOptionError, match="not plain JSON"):
        schema({"type": "number", "maximum": float("nan")})


def test_a_spec_keeps_a_private_copy_of_its_schema() -> None:
    body: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    spec = schema(body)
    body["properties"]["a"]["type"] = "string"
    assert spec.schema == {"type": "object", "properties": {"a": {"type": "integer"}}}


# --- the matcher over a real vocabulary ---------------------------------------------------------


@pytest.fixture(scope="module")
def engine(genai_model_dir: Path) -> Engine:
    return Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))


def _ids(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, parse_special=False)


def test_the_matcher_follows_ids_allows_eos_at_the_end_and_rewinds(engine: Engine) -> None:
    vocab = engine.spec.vocab_size
    eos = engine.eos_token_ids[0]
    constraint = TokenConstraint(ConstraintSpec("json_schema", {"type": "integer"}),
                                 engine.tokenizer, vocab, end_ids=[eos])
    assert not constraint.mask()[eos]  # nothing yet: EOS would end an empty answer
    digits = _ids(engine, "42")
    constraint.sync(digits)
    mask = constraint.mask()
    assert mask[eos] and constraint.complete and not constraint.closed  # "42" may grow
    assert not mask[_ids(engine, "x")[0]]
    constraint.sync([*digits, eos])
    assert constraint.closed
    constraint.sync(digits[:1])  # a rewind
    assert not constraint.closed and constraint.mask()[_ids(engine, "2")[0]]
    with pytest.raises(ConstraintError, match="does not continue"):
        constraint.sync([*digits[:1], _ids(engine, "x")[0]])


def test_special_tokens_and_eos_mid_value_are_masked(engine: Engine) -> None:
    tokenizer = engine.tokenizer
    eos = engine.eos_token_ids[0]
    constraint = TokenConstraint(OBJECT, tokenizer, engine.spec.vocab_size, end_ids=[eos],
                                 banned_ids=tokenizer.special_token_ids)
    constraint.sync(_ids(engine, '{"a":'))
    mask = constraint.mask()
    assert not mask[np.array(sorted(tokenizer.special_token_ids))].any()
    with pytest.raises(ConstraintError, match="EOS came before"):
        constraint.sync([*_ids(engine, '{"a":'), eos])


def test_the_processor_sits_before_the_sampling_filters_and_masks(engine: Engine) -> None:
    options = GenerateOptions(temperature=0.7, top_p=0.9, top_k=10, min_p=0.05,
                              repetition_penalty=1.1, constraint=OBJECT)
    vocab = engine.spec.vocab_size
    constraint = TokenConstraint(OBJECT, engine.tokenizer, vocab)
    chain = make_logits_processors(options, constraint=constraint)
    assert [p.name for p in chain] == ["repetition_penalty", "constraint", "temperature",
                                       "top_k", "top_p", "min_p"]
    with pytest.raises(InvalidOptionError, match="matcher"):
        make_logits_processors(options)
    plain = make_logits_processors(GenerateOptions(constraint=OBJECT), constraint=constraint)
    logits = np.linspace(-1.0, 1.0, vocab + 7, dtype=np.float32)  # a padded lm_head
    out = apply_processors(logits.copy(), plain, ProcessorContext(prompt_ids=[1]))
    allowed = np.flatnonzero(np.isfinite(out))
    texts = engine.tokenizer.token_texts()
    assert allowed.size and all(texts[i].lstrip().startswith("{") for i in allowed)
    assert np.array_equal(out[allowed], logits[allowed])


def test_stops_wait_for_a_complete_answer() -> None:
    stopper = StopChecker(GenerateOptions(constraint=ANY, stop_sequences=("}",)),
                          eos_token_ids=[0])
    assert stopper.check_constrained(1, [1], '{"a":{"b":1}', 1, complete=False) is None
    assert stopper.check_constrained(1, [1], '{"a":1}', 1, complete=True) == \
        FinishReason("stop_sequence", 0)


# --- sampled generations ----------------------------------------------------------------------


def _generate(engine: Engine, spec: ConstraintSpec, **options) -> GenerateResult:
    request = GenerateRequest(prompt="Reply in JSON:", options=GenerateOptions(
        constraint=spec, **{"max_new_tokens": 200, "temperature": 1.0, **options}))
    return engine.generate(request)


def _check(result: GenerateResult, body: dict) -> bool:
    """Validates (True), or ended on a limit mid-value (False); anything else fails."""
    if result.finish_reason.kind in LIMITS:
        return False
    assert result.finish_reason.kind in ("json_complete", "eos_token"), result.finish_reason
    value = json.loads(result.text)
    jsonschema.validate(value, body)
    outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', result.text)
    assert not re.search(r"\s", outside_strings), result.text  # compact by default
    return True


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_sampled_answers_validate_on_the_forged_model(engine: Engine, name: str) -> None:
    body = SCHEMAS[name]
    valid = [_check(_generate(engine, schema(body), seed=seed), body) for seed in range(6)]
    assert sum(valid) >= 3  # most close well inside the budget


def test_sampled_answers_validate_on_the_builtin_model() -> None:
    folder = default_model_dir()
    if folder is None:
        pytest.skip("the built-in model is not in this checkout")
    builtin = Engine.load(folder, EngineConfig(intra_op_threads=1))
    for body in SCHEMAS.values():
        for seed in range(3):
            _check(_generate(builtin, schema(body), seed=seed), body)


def test_a_limit_mid_value_keeps_the_text_so_far(engine: Engine) -> None:
    body = SCHEMAS["pattern_items"]
    cut = _generate(engine, schema(body), max_new_tokens=3, seed=0)
    assert cut.finish_reason.kind == "max_tokens" and len(cut.token_ids) == 3
    assert cut.text.startswith('{"') and cut.text
    whole = _generate(engine, schema(body), seed=0)
    assert whole.text.startswith(cut.text)


def test_regex_and_gbnf_constrain_the_whole_answer(engine: Engine) -> None:
    for seed in range(4):
        result = _generate(engine, ConstraintSpec("regex", text=r"[A-Z]{3}-[0-9]{2,4}"),
                           seed=seed)
        assert re.fullmatch(r"[A-Z]{3}-[0-9]{2,4}", result.text), result.text
        gbnf = 'root ::= answer " " digit+\nanswer ::= "yes" | "no"\ndigit ::= [0-9]'
        result = _generate(engine, ConstraintSpec("grammar", text=gbnf), seed=seed,
                           max_new_tokens=12)
        assert re.fullmatch(r"(yes|no) [0-9]*", result.text), result.text


def test_stop_sequences_never_cut_a_constrained_value(engine: Engine) -> None:
    body = SCHEMAS["non_ascii_enum"]
    result = _generate(engine, schema(body), seed=1, stop_sequences=('"', ",", "}"))
    jsonschema.validate(json.loads(result.text), body)  # whole, though it holds stops


def test_batched_constrained_requests_match_their_solo_runs(engine: Engine) -> None:
    from engine.scheduling.scheduler import Scheduler

    body = SCHEMAS["ref_oneof"]
    requests = [GenerateRequest(prompt=f"JSON {i}:", options=GenerateOptions(
        constraint=schema(body), max_new_tokens=120, temperature=1.0, seed=i))
        for i in range(3)]
    solo = [engine.generate(r).text for r in requests]
    scheduler = Scheduler.of(engine)
    streams = [scheduler.stream(r) for r in requests]
    texts = ["", "", ""]
    live = set(range(3))
    while live:  # consumed in turn: the scheduler runs them together
        for i in sorted(live):
            event = next(streams[i], None)
            if event is None or event.result is not None:
                live.discard(i)
            else:
                texts[i] += event.text
    assert texts == solo


def test_speculation_steps_aside_for_a_constraint(engine: Engine) -> None:
    """Each token's mask needs the token before it: a constrained request asked to
    speculate runs one token per step and gives the answer it gives without asking."""
    body = SCHEMAS["ref_oneof"]
    plain = _generate(engine, schema(body), temperature=0.0)
    asked = _generate(engine, schema(body), temperature=0.0,
                      speculative_mode="prompt_lookup")
    assert asked.text == plain.text and asked.speculation is None
    jsonschema.validate(json.loads(asked.text), body)
