"""The JSON constraint: the recognizer, schemas, token masks, the processor, stop rules,
and sampled generations on a forged model (random weights: only the mask makes it JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import numpy as np
import pytest

from engine import (
    ConstraintError,
    Engine,
    EngineConfig,
    GenerateOptions,
    GenerateRequest,
    GenerateResult,
)
from engine.config import JsonConstraintSpec
from engine.constraint import JsonConstraint, TokenConstraint, ensure_constrained_finish
from engine.errors import InvalidOptionError
from engine.json_grammar import MAX_DEPTH, MAX_WS
from engine.logits import ProcessorContext, apply_processors, make_logits_processors
from engine.stopping import FinishReason, StopChecker
from engine.tokenizer import Tokenizer

ANY = JsonConstraintSpec()
OBJECT = JsonConstraintSpec(object_only=True)


def schema(body: dict) -> JsonConstraintSpec:
    return JsonConstraintSpec("json_schema", body)


def state_of(text: str, spec: JsonConstraintSpec = ANY) -> tuple[bool, bool]:
    """(text is a valid prefix, text is a complete value)."""
    constraint = JsonConstraint(spec)
    return constraint.accepts(text), constraint.completes(text)


# --- the recognizer ----------------------------------------------------------------------


@pytest.mark.parametrize("text, valid, complete", [
    ("", True, False),
    (' {"a": [1, -2.5e+3, true, false, null, "x\\u00e9\\n"], "b": {}}', True, True),
    ('{"a"', True, False),
    ('{"a":', True, False),
    ("[1, 2", True, False),
    ("12", True, True),          # a number is complete but may grow
    ("-", True, False),
    ("0.5E-2 \n", True, True),
    ('"caf\u00e9 \\"quoted\\""', True, True),
    ("tr", True, False),
    ("null", True, True),
    ("[[[]]]", True, True),
    ("{,", False, False),
    ('{"a":1,}', False, False),   # trailing comma
    ("[1,]", False, False),
    ("01", False, False),         # leading zero
    ("1.", True, False),
    ("1.e3", False, False),
    ('"a\\q"', False, False),     # bad escape
    ('"\\u12g"', False, False),
    ('"line\nbreak"', False, False),  # raw control character in a string
    ("{a: 1}", False, False),     # unquoted key
    ("{'a': 1}", False, False),
    ("NaN", False, False),
    ("truex", False, False),
    ("{} {}", False, False),      # one value only
    ("[1] x", False, False),
])
def test_recognizer_prefixes_and_completion(text: str, valid: bool, complete: bool) -> None:
    assert state_of(text) == (valid, complete)


def test_advance_commits_and_refuses_with_the_position() -> None:
    constraint = JsonConstraint()
    constraint.advance('{"k": ')
    before = constraint.position
    with pytest.raises(ConstraintError, match="after 6 characters"):
        constraint.advance("}")
    assert constraint.position == before  # nothing committed on error
    constraint.advance('"v"}')
    assert constraint.complete and constraint.closed


def test_object_only_refuses_other_roots() -> None:
    assert state_of("{}", OBJECT) == (True, True)
    for text in ("[", "1", '"x"', "true"):
        assert state_of(text, OBJECT) == (False, False)
    assert state_of('{"a": [1, "x", {"b": null}]}', OBJECT) == (True, True)


def test_a_number_closes_at_whitespace_and_other_values_at_their_last_character() -> None:
    constraint = JsonConstraint()
    constraint.advance("42")
    assert constraint.complete and not constraint.closed
    constraint.advance(" ")
    assert constraint.closed
    constraint = JsonConstraint()
    constraint.advance('"done"')
    assert constraint.closed


# --- schemas -------------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "title": "Person",  # annotations are ignored
    "properties": {
        "name": {"type": "string", "description": "full name", "format": "text"},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "role": {"enum": ["owner", "viewer", 1, 10, None]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "home": {"type": "object", "properties": {"city": {"const": "Oslo"}},
                 "required": ["city"]},
        "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["name", "age"],
}


@pytest.mark.parametrize("text, valid, complete", [
    ('{"name": "Ada", "age": 36}', True, True),
    ('{"age": 36, "name": "Ada"}', True, True),               # any key order
    ('{"name": "Ada"}', False, False),                          # "age" is required
    ('{"name": "Ada", "age": 36, "extra": 1}', False, False),  # no additionalProperties
    ('{"name": "Ada", "name"', False, False),                  # no duplicate key
    ('{"age": 3.5', False, False),                              # integer
    ('{"age": 1e3', False, False),
    ('{"name": "A", "age": 1, "score": -1.5e2}', True, True),
    ('{"name": 1', False, False),
    ('{"name": "A", "age": 1, "role": "viewer"}', True, True),
    ('{"name": "A", "age": 1, "role": "view"}', False, False),
    ('{"name": "A", "age": 1, "role": 10}', True, True),        # 1 and 10 both listed
    ('{"name": "A", "age": 1, "role": 100', False, False),
    ('{"name": "A", "age": 1, "role": null}', True, True),
    ('{"name": "A", "age": 1, "tags": ["x", "y"]}', True, True),
    ('{"name": "A", "age": 1, "tags": [1', False, False),
    ('{"name": "A", "age": 1, "home": {}', False, False),
    ('{"name": "A", "age": 1, "home": {"city": "Oslo"}}', True, True),
    ('{"name": "A", "age": 1, "home": {"city": "Bergen"', False, False),
    ('{"name": "A", "age": 1, "nick": null}', True, True),
    ('{"name": "A", "age": 1, "nick": "x"}', True, True),
    ('{"name": "A", "age": 1, "nick": 3', False, False),
    ('{"nam', True, False),
    ('{"nax', False, False),
])
def test_schema_subset(text: str, valid: bool, complete: bool) -> None:
    assert state_of(text, schema(PERSON)) == (valid, complete)


def test_additional_properties_open_an_object() -> None:
    open_any = schema({"type": "object", "properties": {"a": {"type": "integer"}},
                       "additionalProperties": True})
    assert state_of('{"a": 1, "zzz": [true]}', open_any) == (True, True)
    assert state_of('{"a": "x"', open_any) == (False, False)    # a listed key keeps its schema
    assert state_of('{"ab": "x"}', open_any) == (True, True)    # diverged from "a": free key
    typed = schema({"additionalProperties": {"type": "boolean"}, "required": ["on"]})
    assert state_of('{"on": true, "x": false}', typed) == (True, True)
    assert state_of('{"on": 1', typed) == (False, False)
    assert state_of('{"x": true', typed) == (True, False)
    assert state_of('{"x": true}', typed) == (False, False)     # "on" is still missing


@pytest.mark.parametrize("body, keyword", [
    ({"type": "integer", "minimum": 0}, "'minimum'"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}, "'$ref'"),
    ({"type": "string", "pattern": "^a"}, "'pattern'"),
    ({"type": "text"}, "'text'"),
    ({"type": "object", "required": ["a"]}, "'a' is required"),
    ({"enum": []}, "non-empty"),
    ({"anyOf": [{"type": "integer"}, {"type": "number"}]}, "overlap"),
    ({"anyOf": [{"enum": ["a"]}, {"type": "string"}]}, "mixes enum"),
    ({"type": "array", "items": 3}, "must be an object"),
])
def test_unsupported_schemas_are_refused_naming_the_keyword(body: dict, keyword: str) -> None:
    with pytest.raises(InvalidOptionError, match="constraint") as info:
        schema(body)
    assert keyword in str(info.value)


def test_spec_validation_and_private_copy() -> None:
    body: dict = {"type": "object", "properties": {"a": {"type": "string"}}}
    spec = schema(body)
    body["properties"]["b"] = {"type": "string"}  # the spec keeps what it was given
    assert state_of('{"b"', spec) == (False, False)
    with pytest.raises(InvalidOptionError, match="kind"):
        JsonConstraintSpec("yaml")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="needs a schema"):
        JsonConstraintSpec("json_schema")
    with pytest.raises(InvalidOptionError, match="object_only"):
        JsonConstraintSpec("json_schema", {"type": "object"}, object_only=True)
    with pytest.raises(InvalidOptionError, match="not plain JSON"):
        schema({"enum": [{1, 2}]})
    with pytest.raises(InvalidOptionError, match="JsonConstraintSpec"):
        GenerateOptions(constraint={"type": "json_object"})  # type: ignore[arg-type]


# --- token masks ---------------------------------------------------------------------------

EXTRA = ['"', '":', '", "', '"}', "}", "]", "},", '"\\', "\\n", "\\u00", "e9", '"a"', " ",
         "  ", "\n", " " * 40, "12", "-", ".5", "e+", "true", "tr", "ue", "null", ", ", "{",
         "[", '["', '{"', '{"name', 'name":', '": "', "", "\ufffd", "é", "\t"]


@pytest.fixture(scope="module")
def texts(tokenizer_dir: Path) -> list[str]:
    vocab = Tokenizer.from_dir(tokenizer_dir).token_texts()
    return [*vocab, *EXTRA]


def brute_force(constraint: JsonConstraint, texts: list[str]) -> np.ndarray:
    from engine.json_grammar import structural

    run = constraint.position[2]
    room = max(MAX_WS - run, 0) if structural(constraint.state) else None
    out = []
    for text in texts:
        lead = len(text) - len(text.lstrip(" \t\n\r"))
        out.append(bool(text) and constraint.accepts(text) and (room is None or lead <= room))
    return np.array(out)


@pytest.mark.parametrize("spec, prefixes", [
    (ANY, ["", "{", '{"a', '{"a"', '{"a":', '{"a": "x', '{"a": "x\\', '{"a": "x\\u00',
           "[1", "[1,", "[tr", "-", "12", "  ", " " * 20, '"\\u', '"ab"', "[[[[{"]),
    (schema(PERSON), ["", "{", '{"na', '{"name"', '{"name": "', '{"name": "A", ',
                      '{"name": "A", "age": 1', '{"name": "A", "age": 1, "role": ',
                      '{"name": "A", "age": 1, "role": 1', '{"name": "A", "age": 1, "tags": [']),
])
def test_masks_match_a_brute_force_check_of_every_token(
        texts: list[str], spec: JsonConstraintSpec, prefixes: list[str]) -> None:
    for prefix in prefixes:
        constraint = JsonConstraint(spec)
        constraint.advance(prefix)
        mask = constraint.allowed_mask(texts)
        expected = brute_force(constraint, texts)
        diff = [texts[i] for i in np.flatnonzero(mask != expected)]
        assert not diff, (prefix, diff[:10])
        assert not mask.flags.writeable


def test_whitespace_runs_and_nesting_are_capped(texts: list[str]) -> None:
    constraint = JsonConstraint(OBJECT)
    constraint.advance("{" + " " * (MAX_WS - 1))
    mask = constraint.allowed_mask(texts)
    assert mask[texts.index(" ")] and not mask[texts.index("  ")]
    assert mask[texts.index('"')] and mask[texts.index("}")]
    constraint.advance(" ")
    mask = constraint.allowed_mask(texts)
    assert not mask[texts.index(" ")] and mask[texts.index("}")]
    assert constraint.accepts(" " * 100)  # longer runs are still valid JSON text
    deep = JsonConstraint()
    deep.advance("[" * MAX_DEPTH)
    assert not deep.accepts("[") and not deep.accepts("{") and deep.accepts("1]")


def test_token_constraint_follows_ids_ends_and_rewinds() -> None:
    texts = ["{", "}", '"a"', ":", "1", "<eos>", "<pad>", ""]
    constraint = TokenConstraint(OBJECT, texts, end_ids=[5], banned_ids=[5, 6])
    allowed = constraint.allowed()
    assert allowed.mask.tolist() == [True, False, False, False, False, False, False, False]
    constraint.sync([0, 2, 3])
    assert constraint.allowed().mask.tolist() == [True, False, True, False, True,
                                                  False, False, False]
    constraint.sync([0, 2, 3, 4])
    assert constraint.allowed().mask[1] and not constraint.allowed().mask[5]  # EOS: incomplete
    constraint.sync([0, 2, 3, 4, 1])
    assert constraint.closed and constraint.complete
    constraint.sync([0])  # a rewind
    assert not constraint.complete and constraint.json.position[1] == 1
    with pytest.raises(ConstraintError, match="EOS came before"):
        constraint.sync([0, 5])


def test_end_ids_are_allowed_once_a_number_is_complete() -> None:
    constraint = TokenConstraint(ANY, ["1", " ", "x", "</s>"], end_ids=[3])
    constraint.sync([0])
    assert constraint.allowed().mask.tolist() == [True, True, False, True]
    constraint.sync([0, 3])
    assert constraint.closed


# --- the processor chain and the stop rules (the seed's tests) ---------------------------------


def test_processor_chain_includes_json_constraint_before_sampling_filters(
        texts: list[str]) -> None:
    options = GenerateOptions(temperature=0.7, top_p=0.9, top_k=10, min_p=0.05,
                              repetition_penalty=1.1, frequency_penalty=0.2,
                              presence_penalty=0.3, constraint=ANY)
    chain = make_logits_processors(options, constraint=TokenConstraint(ANY, texts))
    assert [p.name for p in chain] == [
        "repetition_penalty", "frequency_penalty", "presence_penalty", "json_constraint",
        "temperature", "top_k", "top_p", "min_p"]
    with pytest.raises(InvalidOptionError, match="token texts"):
        make_logits_processors(options)


def test_processor_sets_disallowed_tokens_to_minus_infinity(texts: list[str]) -> None:
    constraint = TokenConstraint(OBJECT, texts)
    chain = make_logits_processors(GenerateOptions(constraint=OBJECT), constraint=constraint)
    context = ProcessorContext(prompt_ids=[1])
    logits = np.linspace(-1.0, 1.0, len(texts) + 7, dtype=np.float32)  # a padded lm_head
    out = apply_processors(logits.copy(), chain, context)
    allowed = constraint.allowed().mask
    assert np.all(np.isneginf(out[: len(texts)][~allowed]))
    assert np.array_equal(out[: len(texts)][allowed], logits[: len(texts)][allowed])
    assert np.all(np.isneginf(out[len(texts):]))
    short = apply_processors(logits[:10].copy(), chain, context)  # fewer logits than texts
    assert short.shape == (10,)


def test_json_constraint_defers_stop_until_value_is_complete() -> None:
    options = GenerateOptions(constraint=ANY, stop_sequences=("}",))
    stopper = StopChecker(options, eos_token_ids=[0])
    incomplete, complete = '{"value":', '{"value":1}'
    assert stopper.check_constrained(
        1, [1], incomplete, 1, complete=JsonConstraint().completes(incomplete)) is None
    assert stopper.check_constrained(
        1, [1], complete, 1, complete=JsonConstraint().completes(complete)) == \
        FinishReason("stop_sequence", 0)
    inner = '{"a":{"b":1}'  # a "}" that closes an inner object does not stop
    assert stopper.check_constrained(1, [1], inner, 1, complete=False) is None


def test_incomplete_json_constraint_rejects_length_finishes() -> None:
    options = GenerateOptions(constraint=ANY)
    for reason in (FinishReason("max_tokens"), FinishReason("length")):
        with pytest.raises(ConstraintError, match="stopped before a complete JSON value"):
            ensure_constrained_finish(options, '{"value":', reason)
    ensure_constrained_finish(options, '{"value":1}', FinishReason("max_tokens"))
    ensure_constrained_finish(options, "", FinishReason("eos_token"))
    ensure_constrained_finish(options, '{"value', FinishReason("cancelled"))
    ensure_constrained_finish(GenerateOptions(), '{"value":', FinishReason("max_tokens"))


# --- sampled generations on the forged model ---------------------------------------------------

SMALL = {"type": "object",
         "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["a", "b", "c"]},
                        "ids": {"type": "array", "items": {"enum": [1, 2, 3]}},
                        "note": {"type": ["null", "boolean"]}},
         "required": ["ok", "kind"]}


@pytest.fixture(scope="module")
def engine(genai_model_dir: Path) -> Engine:
    return Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))


def _generate(engine: Engine, spec: JsonConstraintSpec, **options) -> GenerateResult:
    """A constrained sample. Whitespace-only tokens get a -4 bias: the random model loves
    them, and without it answers often run past the 256-token context (the mask allows
    runs of up to 32 characters between any two JSON tokens)."""
    bias = {i: -4.0 for i, t in enumerate(engine.tokenizer.token_texts()) if t and not t.strip()}
    request = GenerateRequest(prompt="Reply in JSON:", options=GenerateOptions(
        constraint=spec, logit_bias=bias, **{"max_new_tokens": 230, **options}))
    return engine.generate(request)


def test_sampled_schema_outputs_parse_and_validate(engine: Engine) -> None:
    for seed in range(6):
        result = _generate(engine, schema(SMALL), seed=seed, temperature=1.5)
        value = json.loads(result.text)
        jsonschema_rs.validate(SMALL, value)
        assert result.finish_reason.kind == "json_complete"
        assert engine.tokenizer.decode(result.token_ids).strip() == result.text.strip()
    greedy = _generate(engine, schema(SMALL), temperature=0.0, top_logprobs=2)
    jsonschema_rs.validate(SMALL, json.loads(greedy.text))
    assert all(np.isfinite(lp.logprob) for lp in greedy.logprobs)


def test_sampled_json_object_outputs_parse_or_fail_loudly(engine: Engine) -> None:
    parsed = 0
    for seed in range(8):
        try:
            result = _generate(engine, OBJECT, seed=seed)
        except ConstraintError as exc:  # the random model ran out of tokens mid-value
            assert "stopped before a complete JSON value" in str(exc)
            continue
        assert isinstance(json.loads(result.text), dict)
        parsed += 1
    assert parsed >= 2


def test_a_limit_mid_value_is_an_error_not_truncated_json(engine: Engine) -> None:
    request = GenerateRequest(prompt="x", options=GenerateOptions(
        constraint=schema(SMALL), max_new_tokens=3, seed=0))
    texts = []
    with pytest.raises(ConstraintError, match="stopped before a complete JSON value"):
        for event in engine.stream(request):
            texts.append(event.text)
    assert texts  # the tokens streamed, then the error instead of a result
    request = GenerateRequest(prompt="x", options=GenerateOptions(
        constraint=schema(SMALL), max_new_tokens=200, max_context=8, seed=0))
    with pytest.raises(ConstraintError, match="the context length"):
        engine.generate(request)
    after = engine.generate(GenerateRequest(prompt="x", options=GenerateOptions(
        max_new_tokens=3, seed=0)))  # the engine is fine afterwards
    assert len(after.token_ids) <= 3


def test_stop_sequences_never_cut_a_constrained_value(engine: Engine) -> None:
    result = _generate(engine, schema(SMALL), seed=1, stop_sequences=('"', ",", "}"))
    jsonschema_rs.validate(SMALL, json.loads(result.text))  # whole, though it holds stops
    assert result.finish_reason.kind == "stop_sequence"  # the closing token held one
