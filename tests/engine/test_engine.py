"""End-to-end generation on real ONNX Runtime sessions over forged and reference models."""

import json
import threading

import pytest

from engine import (
    ChatMessage,
    ContextOverflowError,
    Engine,
    EngineConfig,
    GenerateOptions,
    GenerateRequest,
    InvalidOptionError,
    InvalidPromptError,
)
from tests.forge.reference_loop import og_greedy, reference_greedy

GREEDY = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=64)
PROMPT = (5, 17, 42, 99, 7, 300, 12)


def _greedy(engine: Engine, ids, n=64, **kw) -> list[int]:
    opts = GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=n, **kw)
    return list(engine.generate(GenerateRequest(token_ids=tuple(ids), options=opts)).token_ids)


@pytest.fixture(scope="module")
def genai(genai_model_dir) -> Engine:
    return Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))


# --- token-exact against the peers -------------------------------------------------------


def test_reference_genai_export_matches_recorded_onnxruntime_genai(reference_models_dir):
    expected = json.loads((reference_models_dir / "expected-onnxruntime-genai.json").read_text())
    engine = Engine.load(reference_models_dir / "tiny-genai-fp32")
    for case in expected["models"]["tiny-genai-fp32"]:
        assert engine.tokenizer.encode(case["prompt"]) == case["prompt_token_ids"]
        got = _greedy(engine, case["prompt_token_ids"], n=len(case["greedy_new_tokens"]))
        assert got == case["greedy_new_tokens"]


def test_reference_genai_export_matches_live_onnxruntime_genai_for_64_tokens(
        reference_models_dir):
    folder = reference_models_dir / "tiny-genai-fp32"
    engine = Engine.load(folder)
    prompt = engine.tokenizer.encode("class Stack:\n    def push(self, item):\n")
    assert _greedy(engine, prompt) == og_greedy(folder, prompt, 64)


def test_forged_genai_layout_matches_onnxruntime_genai(genai, genai_model_dir):
    assert genai.decode_path == "shared_buffer"
    assert _greedy(genai, PROMPT) == og_greedy(genai_model_dir, list(PROMPT), 64)


def test_pruned_lm_head_graph_matches_onnxruntime_genai(genai_pruned_model_dir):
    engine = Engine.load(genai_pruned_model_dir)
    assert engine.spec.logits_last_only
    assert _greedy(engine, PROMPT) == og_greedy(genai_pruned_model_dir, list(PROMPT), 64)


def test_optimum_layouts_match_a_plain_onnxruntime_loop(optimum_model_dir, reference_models_dir):
    for folder in (optimum_model_dir, reference_models_dir / "tiny-optimum"):
        engine = Engine.load(folder)
        assert engine.decode_path == "growing"
        assert _greedy(engine, PROMPT) == reference_greedy(folder, list(PROMPT), 64)


def test_static_cache_layout_matches_a_plain_onnxruntime_loop(static_model_dir):
    engine = Engine.load(static_model_dir)
    assert engine.decode_path == "static_cache"
    assert _greedy(engine, PROMPT, n=48) == reference_greedy(static_model_dir, list(PROMPT), 48)


def test_chunked_prefill_gives_the_same_tokens(genai_model_dir, genai):
    chunked = Engine.load(genai_model_dir, EngineConfig(prefill_chunk_size=3))
    long_prompt = list(range(20, 60))
    assert _greedy(chunked, long_prompt, n=24) == _greedy(genai, long_prompt, n=24)


# --- finish reasons -----------------------------------------------------------------------


def test_seed_case_context_of_16_stops_with_length_after_13_tokens(genai):
    result = genai.generate(GenerateRequest(token_ids=(2, 4, 3), options=GenerateOptions(
        max_new_tokens=32, temperature=0.0, stop_on_eos=False, max_context=16)))
    assert len(result.token_ids) == 13
    assert str(result.finish_reason) == "length"


def test_max_new_tokens_finishes_with_max_tokens(genai):
    result = genai.generate(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=5, temperature=0.0, stop_on_eos=False)))
    assert len(result.token_ids) == 5 and str(result.finish_reason) == "max_tokens"


def test_every_eos_id_ends_generation_and_is_not_returned(genai):
    greedy = _greedy(genai, PROMPT, n=8)
    eos = greedy[3]
    first = greedy.index(eos)
    result = genai.generate(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=8, temperature=0.0, eos_token_ids=(99999, eos))))
    assert str(result.finish_reason) == "eos_token"
    assert list(result.token_ids) == greedy[:first]
    ignoring = genai.generate(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=8, temperature=0.0, eos_token_ids=(eos,), stop_on_eos=False)))
    assert list(ignoring.token_ids) == greedy


def test_min_new_tokens_masks_eos_until_reached(genai):
    greedy = _greedy(genai, PROMPT, n=1)
    result = genai.generate(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=6, temperature=0.0, eos_token_ids=(greedy[0],), min_new_tokens=3)))
    assert result.token_ids[0] != greedy[0]
    assert len(result.token_ids) >= 3


def test_token_stop_sequence_finishes_with_its_index(genai):
    greedy = _greedy(genai, PROMPT, n=10)
    stop = tuple(greedy[4:6])
    result = genai.generate(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=10, temperature=0.0, stop_on_eos=False,
        stop_sequences=((1, 2, 3, 4, 5, 6), stop))))
    assert str(result.finish_reason) == "stop_sequence(1)"
    assert list(result.token_ids[-2:]) == list(stop)
    assert len(result.token_ids) <= 6


def test_text_stop_sequence_is_not_returned(genai):
    full = genai.generate(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=24, temperature=0.0, stop_on_eos=False)))
    text = full.text
    cut = next(i for i in range(len(text) // 2, len(text)) if text[i].strip())
    stop = text[cut:cut + 2]
    result = genai.generate(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=24, temperature=0.0, stop_on_eos=False, stop_sequences=(stop,))))
    assert str(result.finish_reason) == "stop_sequence(0)"
    assert result.text == text[: text.index(stop)]
    assert stop not in result.text


def test_cancel_flag_stops_the_stream(genai):
    cancel = threading.Event()
    events = []
    for event in genai.stream(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
            max_new_tokens=50, temperature=0.0, stop_on_eos=False)), cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    result = events[-1].result
    assert result is not None and str(result.finish_reason) == "cancelled"
    assert len(result.token_ids) == 3


# --- sampling options ---------------------------------------------------------------------


def _sample(engine, **kw):
    opts = GenerateOptions(max_new_tokens=24, stop_on_eos=False, **kw)
    return list(engine.generate(GenerateRequest(token_ids=PROMPT, options=opts)).token_ids)


def test_same_seed_same_tokens_and_other_seeds_differ(genai):
    a = _sample(genai, temperature=1.5, seed=7)
    assert a == _sample(genai, temperature=1.5, seed=7)
    others = [_sample(genai, temperature=1.5, seed=s) for s in (8, 9, 10)]
    assert all(other != a for other in others)  # each other seed, other tokens
    assert len({tuple(other) for other in others}) == 3
    assert a != _greedy(genai, PROMPT, n=24)


def test_filters_that_leave_one_candidate_reduce_sampling_to_greedy(genai):
    greedy = _greedy(genai, PROMPT, n=24)
    assert _sample(genai, temperature=2.0, top_k=1, seed=3) == greedy
    assert _sample(genai, temperature=2.0, min_p=1.0, seed=3) == greedy
    assert _sample(genai, temperature=0.05, top_p=0.01, seed=3) == greedy


def test_penalties_reduce_repetition(genai):
    def repeats(tokens):
        return len(tokens) - len(set(tokens))

    greedy = _greedy(genai, PROMPT, n=48)
    assert repeats(greedy) >= 5  # the forged model repeats itself when nothing stops it
    for kw in ({"repetition_penalty": 5.0}, {"frequency_penalty": 2.0},
               {"presence_penalty": 2.0}):
        penalised = _greedy(genai, PROMPT, n=48, **kw)
        assert penalised != greedy
        assert repeats(penalised) < repeats(greedy), kw


def test_logit_bias_forces_a_token(genai):
    tokens = _greedy(genai, PROMPT, n=6, logit_bias={123: 100.0})
    assert tokens == [123] * 6


def test_top_logprobs_are_sorted_log_probabilities_including_the_choice(genai):
    result = genai.generate(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=5, temperature=0.0, stop_on_eos=False, top_logprobs=3)))
    assert len(result.logprobs) == 5
    for token, lp in zip(result.token_ids, result.logprobs, strict=True):
        assert lp.token_id == token and lp.logprob <= 0.0
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True) and len(lp.top) == 3
        assert lp.top[0][0] == token  # greedy picks the most likely token


# --- streaming ----------------------------------------------------------------------------


def test_stream_is_incremental(genai):
    events = list(genai.stream(GenerateRequest(token_ids=PROMPT, options=GenerateOptions(
        max_new_tokens=40, temperature=0.0, stop_on_eos=False))))
    tokens = [e for e in events if e.token_id is not None]
    result = events[-1].result
    assert result is not None and len(tokens) == 40
    # the first token is timestamped well before the last one: nothing is batched at the end
    assert tokens[0].timestamp < tokens[-1].timestamp
    assert tokens[0].timestamp < events[-1].timestamp - 0.25 * (
        events[-1].timestamp - tokens[0].timestamp)
    assert "".join(e.text for e in events) == result.text
    assert result.timings.ttft_ms > 0 and result.timings.decode_tok_s > 0
    assert result.timings.prefill_tok_s > 0


def test_chat_request_uses_the_template(genai):
    messages = (ChatMessage("user", "hi"),)
    text = genai.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    result = genai.generate(GenerateRequest(messages=messages, options=GenerateOptions(
        max_new_tokens=4, temperature=0.0)))
    assert result.prompt_tokens == len(genai.tokenizer.encode(text))


# --- bad input ----------------------------------------------------------------------------


def test_empty_prompt_is_refused(genai):
    with pytest.raises(InvalidPromptError, match="empty"):
        genai.generate(GenerateRequest(prompt=""))


def test_out_of_vocabulary_ids_are_refused(genai):
    with pytest.raises(InvalidPromptError, match="outside the vocabulary"):
        genai.generate(GenerateRequest(token_ids=(1, 10**6)))


def test_prompt_filling_the_context_is_refused_with_numbers(genai):
    with pytest.raises(ContextOverflowError, match="3 tokens.*holds 3") as err:
        genai.generate(GenerateRequest(token_ids=(1, 2, 3), options=GenerateOptions(
            max_context=3)))
    assert err.value.hint


def test_request_needs_exactly_one_prompt_kind():
    with pytest.raises(InvalidPromptError, match="exactly one"):
        GenerateRequest(prompt="a", token_ids=(1,))


@pytest.mark.parametrize("field,value", [
    ("max_new_tokens", 0), ("max_new_tokens", 1.5), ("temperature", -1.0),
    ("temperature", float("nan")), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
    ("min_p", 2.0), ("repetition_penalty", 0.0), ("frequency_penalty", 3.0),
    ("presence_penalty", -3.0), ("seed", -1), ("stop_sequences", ("",)),
    ("stop_sequences", ((),)), ("top_logprobs", 21), ("max_context", 1),
    ("logit_bias", {-1: 1.0}), ("min_new_tokens", -1), ("eos_token_ids", (-5,)),
])
def test_invalid_options_name_the_field_and_the_fix(field, value):
    with pytest.raises(InvalidOptionError) as err:
        GenerateOptions(**{field: value})
    assert err.value.field.startswith(field)
    assert err.value.hint


def test_int4_matmulnbits_graph_matches_onnxruntime_genai(genai_model_dir, tmp_path):
    from tests.forge import quantize_int4

    folder = quantize_int4(genai_model_dir, tmp_path / "int4")
    engine = Engine.load(folder)
    assert engine.model.graph.quantization == "int4"
    assert _greedy(engine, PROMPT, n=32) == og_greedy(folder, list(PROMPT), 32)


def test_fim_request_uses_the_model_layout_and_stops_on_fim_tokens(genai):
    from engine.text.fim import fim_stop_token_ids

    request = genai.fim_request("def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n",
                                GenerateOptions(max_new_tokens=8, temperature=0.0))
    tok = genai.tokenizer
    assert request.token_ids is not None
    assert request.token_ids[0] == tok.token_to_id("<|fim_prefix|>")
    assert request.token_ids[-1] == tok.token_to_id("<|fim_middle|>")
    assert genai.fim_family is not None
    assert request.options.eos_token_ids is not None
    assert set(fim_stop_token_ids(genai.fim_family)) <= set(request.options.eos_token_ids)
    result = genai.generate(request)
    assert "print(add" not in result.text  # the suffix is never appended to the output



def test_truncation_only_when_asked_and_reported(genai):
    long_prompt = tuple(range(10, 250))  # the forge's context is 256
    with pytest.raises(ContextOverflowError, match="truncate_prompt"):
        genai.generate(GenerateRequest(token_ids=long_prompt, options=GenerateOptions(
            max_new_tokens=32, temperature=0.0, max_context=200)))
    result = genai.generate(GenerateRequest(token_ids=long_prompt, options=GenerateOptions(
        max_new_tokens=32, temperature=0.0, max_context=200, truncate_prompt=True,
        stop_on_eos=False)))
    assert result.prompt_tokens == 200 - 32 and result.prompt_tokens_dropped == 240 - 168
    assert len(result.token_ids) == 32
    kept = long_prompt[-168:]
    assert list(result.token_ids) == _greedy(genai, kept, n=32)
