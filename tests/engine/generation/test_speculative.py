"""Speculation (prompt lookup, draft model, the default "auto"): several tokens per forward
pass, output unchanged (fp32, and int4 on the engine's kernels; with ONNX Runtime's, int4
up to a near-tie: tests/engine/equivalence.py)."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.errors import InvalidOptionError
from engine.generation.speculative import AdaptiveK, PromptLookup, verify_greedy
from engine.scheduling.scheduler import Scheduler
from tests.engine.equivalence import assert_follows_solo_up_to_a_near_tie, exact_paths

PATTERN = [1, 2, 3, 4] * 12


def test_prompt_lookup_continues_the_latest_occurrence_of_the_tail():
    lookup = PromptLookup(ngram=3, max_tokens=8)
    history = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup.propose(history, 3) == [7, 8, 5]  # the later occurrence wins
    assert lookup.propose([4, 5, 6, 5], 2) == [6, 5]  # falls back to a 1-gram
    assert lookup.propose([1, 2, 3], 4) == []
    assert lookup.propose(history, 0) == []


def _scan(history, ngram=3):
    """The definition: where the latest earlier occurrence of the longest tail n-gram
    continues (None: no n-gram of the tail occurs earlier)."""
    for n in range(min(ngram, len(history) - 1), 0, -1):
        tail = history[-n:]
        for end in range(len(history) - 1, n - 1, -1):
            if history[end - n:end] == tail:
                return end
    return None


def test_the_incremental_index_agrees_with_a_scan_as_histories_grow_or_change():
    rng = np.random.default_rng(5)
    lookup = PromptLookup(ngram=3, max_tokens=16)
    for _ in range(100):
        history = rng.integers(0, 5, size=int(rng.integers(1, 6))).tolist()
        for _ in range(30):  # a growing history, indexed incrementally
            assert lookup._latest(lookup._sync(history))[0] == _scan(history)
            guess = lookup.propose(history, 4)  # the copy pointer's paths, on noise
            assert len(guess) == (0 if _scan(history) is None and lookup._copy is None
                                  else 4) and set(guess) <= set(history)
            history = history + rng.integers(0, 5, size=int(rng.integers(1, 4))).tolist()
        other = rng.integers(0, 5, size=25).tolist()  # not an extension: re-indexed
        assert lookup._latest(lookup._sync(other))[0] == _scan(other)


def test_a_guess_that_reaches_the_end_of_the_history_goes_on_copying_the_loop():
    # the latest occurrence of (1, 2) is two tokens back: an overlapping copy, not [1, 2]
    assert PromptLookup(ngram=3, max_tokens=8).propose([5, 1, 2, 1, 2], 6) == [1, 2] * 3
    # a renamed copy that is itself copied again keeps one suffix, not two
    lookup = PromptLookup(ngram=3, max_tokens=16)
    history = [1, 7, 2, 3, 0, 1, 7, 99, 2, 3, 0, 1, 7]
    lookup.propose(history[:7], 2)  # the copy of the first line begins
    assert lookup.propose(history, 4) == [99, 2, 3, 0]
    assert PromptLookup(ngram=3, max_tokens=8).propose([4, 3, 3], 4) == [3, 3, 3, 3]


def test_a_rewrite_that_renames_a_name_is_followed_with_the_new_name():
    lookup = PromptLookup(ngram=3, max_tokens=16)
    source = [1, 7, 2, 3, 4, 9, 7, 5, 6, 8]  # a function in which the name 7 appears twice
    history = [*source, 0, 1, 7]  # the rewrite starts copying it
    assert lookup.propose(history, 3) == [2, 3, 4]
    history += [99, 2, 3]  # 7 became 7 99 (a suffix added), the rest is copied
    # the insertion is spliced in where the copy passes the next 7
    assert lookup.propose(history, 5) == [4, 9, 7, 99, 5]
    history += [4, 9, 7]
    # the copy goes on after the renamed name with the same suffix; the latest
    # occurrence of the tail alone (4, 9, 7) would have guessed 5 6 8
    assert lookup.propose(history, 4) == [99, 5, 6, 8]
    assert lookup.propose(history + [99], 3) == [5, 6, 8]  # still on track mid-insertion
    # the output leaves the function for good: after `patience` misses the pointer is
    # dropped and the n-gram lookup takes over again
    history += [42, 43, 44, 45, 46, 1, 7]
    assert lookup.propose(history, 3) == [99, 2, 3]


def test_prompt_lookup_validates_its_settings():
    with pytest.raises(InvalidOptionError, match="ngram"):
        PromptLookup(ngram=0)
    with pytest.raises(InvalidOptionError, match="speculative_mode"):
        GenerateOptions(speculative_mode="eagle")
    with pytest.raises(InvalidOptionError, match="num_speculative_tokens"):
        GenerateOptions(num_speculative_tokens=0)


def test_verify_keeps_the_matching_prefix_and_the_targets_next_token():
    rows = np.full((4, 10), -1.0)
    for i, t in enumerate([4, 5, 9, 2]):  # the target's greedy picks at each position
        rows[i, t] = 1.0
    assert verify_greedy(rows, [4, 5, 6]) == [4, 5, 9]
    assert verify_greedy(rows, [1, 5, 9]) == [4]
    assert verify_greedy(rows, [4, 5, 9]) == [4, 5, 9, 2]


def test_adaptive_k_shrinks_on_misses_and_grows_on_hits():
    k = AdaptiveK(4, 8)
    k.update(4, 4)
    assert k.k == 5
    k.update(5, 1)
    assert k.k == 2


@pytest.fixture(scope="module")
def int4_draft(genai_model_dir, tmp_path_factory):
    """The target's own weights in int4: a draft that is right often, not always."""
    from tests.forge import quantize_int4

    return quantize_int4(genai_model_dir, tmp_path_factory.mktemp("int4-draft"), block_size=32)


@pytest.fixture(scope="module")
def recompute_model_dir(tmp_path_factory, forge_spec):
    from tests.forge import write_optimum_model

    return write_optimum_model(tmp_path_factory.mktemp("forge-nokv"), forge_spec, kv_cache=False)


@pytest.fixture(scope="module", params=["genai", "optimum", "static", "recompute"])
def engine(request, genai_model_dir, optimum_model_dir, static_model_dir, recompute_model_dir,
           int4_draft):
    """Every runner layout (shared buffer, growing, static cache, recompute), fp32, with a
    draft model loaded."""
    folder = {"genai": genai_model_dir, "optimum": optimum_model_dir,
              "static": static_model_dir, "recompute": recompute_model_dir}[request.param]
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1, prefix_cache=False,
                                              draft_model=str(int4_draft)))
    assert engine.decode_path == {"genai": "shared_buffer", "optimum": "growing",
                                  "static": "static_cache"}.get(request.param, "recompute")
    return engine


def _run(engine, prompt, mode, n=14, **kw):
    engine.runner.reset()
    fields = {"temperature": 0.0, "stop_on_eos": False, **kw}
    return engine.generate(GenerateRequest(token_ids=tuple(prompt), options=GenerateOptions(
        max_new_tokens=n, speculative_mode=mode, **fields)))


def test_speculation_gives_the_same_tokens_with_fewer_forward_passes(engine):
    plain = _run(engine, PATTERN, "none")
    fast = _run(engine, PATTERN, "prompt_lookup")
    assert fast.token_ids == plain.token_ids
    stats = fast.speculation
    assert stats is not None and stats.tokens == len(fast.token_ids) - 1
    assert stats.accepted > 0 and stats.tokens_per_forward > 1.0
    for prompt in ([5, 17, 42, 99, 7, 300, 12], [3, 9] * 10):
        assert _run(engine, prompt, "prompt_lookup").token_ids == \
            _run(engine, prompt, "none").token_ids


def _seeded_prompts(engine, count=50):
    """Random text q, then q's own greedy continuation g, then q again: the answer tends
    to repeat g (an edit in miniature), so guesses are right sometimes, wrong sometimes."""
    rng = np.random.default_rng(2024)
    for _ in range(count):
        q = rng.integers(1, 512, size=int(rng.integers(3, 10))).tolist()
        yield [*q, *_run(engine, q, "none", n=12).token_ids, *q]


@pytest.mark.parametrize("mode", ["prompt_lookup", "draft_model"])
def test_fifty_seeded_prompts_are_token_identical_and_rewinds_leave_no_trace(engine, mode):
    proposed = accepted = 0
    for prompt in _seeded_prompts(engine):
        plain = _run(engine, prompt, "none", n=16)
        runner = engine.runner
        plain_kv = runner.export_kv(0, runner.length) if runner.transfers_kv else []
        fast = _run(engine, prompt, mode, n=16)
        assert fast.token_ids == plain.token_ids, prompt
        # no trace of rejected guesses: exactly the KV of prompt + answer (last one unfed)
        assert runner.tokens == [*prompt, *fast.token_ids[:-1]]
        assert runner.length == len(runner.tokens)
        if runner.transfers_kv:
            for before, after in zip(plain_kv, runner.export_kv(0, runner.length), strict=True):
                np.testing.assert_allclose(after, before, rtol=0, atol=1e-5)
        assert fast.speculation is not None
        proposed += fast.speculation.proposed
        accepted += fast.speculation.accepted
    assert 0 < accepted < proposed  # guesses were both kept and rewound


def test_speculation_steps_aside_where_it_could_change_the_output(engine):
    sampled = _run(engine, PATTERN, "prompt_lookup", temperature=0.8, seed=3)
    logprobs = _run(engine, PATTERN, "prompt_lookup", top_logprobs=2)
    assert sampled.speculation is None and logprobs.speculation is None


def test_a_stop_inside_a_verified_block_ends_there(engine):
    plain = list(_run(engine, PATTERN, "none").token_ids)
    stop = plain[5]
    cut = plain.index(stop)
    result = _run(engine, PATTERN, "prompt_lookup", eos_token_ids=(stop,), stop_on_eos=True)
    assert list(result.token_ids) == plain[:cut]
    again = _run(engine, PATTERN, "prompt_lookup")  # the engine's KV is consistent after it
    assert list(again.token_ids) == plain


def test_speculating_requests_run_beside_others_in_the_scheduler(engine):
    scheduler = Scheduler(engine)
    results: dict[str, list] = {"fast": [], "plain": []}
    prompts = {"fast": PATTERN, "plain": [5, 17, 42, 99, 7]}
    for name, prompt in prompts.items():
        mode = "prompt_lookup" if name == "fast" else "none"
        scheduler.submit(GenerateRequest(token_ids=tuple(prompt), options=GenerateOptions(
            temperature=0.0, stop_on_eos=False, max_new_tokens=12, speculative_mode=mode)),
            results[name].append)
    while scheduler.step():
        pass
    for name, prompt in prompts.items():
        assert results[name][-1].result.token_ids == \
            _run(engine, prompt, "none", n=12).token_ids


def _draft_engine(target_dir, draft_dir):
    return Engine.load(target_dir, EngineConfig(intra_op_threads=1, prefix_cache=False,
                                                draft_model=str(draft_dir)))


def test_a_draft_model_of_the_same_weights_is_always_right(genai_model_dir):
    engine = _draft_engine(genai_model_dir, genai_model_dir)
    assert engine.draft_runner is not None  # its prefill runs the head for the last row
    assert engine.draft_runner.spec.logits_to_keep == "logits_to_keep"
    plain = _run(engine, [5, 17, 42, 99, 7], "none", n=24)
    fast = _run(engine, [5, 17, 42, 99, 7], "draft_model", n=24)
    assert fast.token_ids == plain.token_ids
    assert fast.speculation is not None and fast.speculation.acceptance_rate == 1.0
    assert fast.speculation.tokens_per_forward > 2


def test_a_different_draft_model_never_changes_the_output(genai_model_dir, tmp_path):
    from tests.forge import ForgeSpec, write_genai_model

    other = write_genai_model(tmp_path / "draft", ForgeSpec(seed=7, layers=1))
    engine = _draft_engine(genai_model_dir, other)
    for prompt in ([5, 17, 42, 99, 7], PATTERN):
        assert _run(engine, prompt, "draft_model", n=20).token_ids == \
            _run(engine, prompt, "none", n=20).token_ids


def test_draft_models_need_the_same_tokenizer_and_a_loaded_draft(genai_model_dir, tmp_path):
    from engine.errors import ModelLoadError
    from tests.forge import ForgeSpec, write_genai_model

    other = write_genai_model(tmp_path / "wide", ForgeSpec(vocab=600), tokenizer_vocab=600)
    with pytest.raises(ModelLoadError, match="another tokenizer"):
        _draft_engine(genai_model_dir, other)
    plain = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    with pytest.raises(InvalidOptionError, match="draft model"):
        _run(plain, PATTERN, "draft_model")


@pytest.mark.parametrize("mode", ["prompt_lookup", "draft_model"])
def test_int4_speculation_follows_plain_greedy_up_to_a_near_tie(int4_model_dir,
                                                                 int4_fp32_model_dir, mode):
    """int4: on the engine's kernels a verify pass gives each row the bits of a one-token
    step, so the answer is plain greedy's; on ONNX Runtime's it may round differently
    (tests/engine/equivalence.py, docs/speculative.md); on fp32 graphs above it is exact.
    Its own fp32 weights are the draft."""
    engine = Engine.load(int4_model_dir, EngineConfig(
        intra_op_threads=1, prefix_cache=False, draft_model=str(int4_fp32_model_dir)))
    rng = np.random.default_rng(2024)
    parted, accepted = [], 0
    for _ in range(30):
        q = rng.integers(1, 2000, size=int(rng.integers(3, 10))).tolist()
        prompt = [*q, *_run(engine, q, "none", n=12).token_ids, *q]
        fast = _run(engine, prompt, mode, n=16)
        assert fast.speculation is not None
        accepted += fast.speculation.accepted
        solo = _run(engine, prompt, "none", n=16, top_logprobs=5)
        parted.append(assert_follows_solo_up_to_a_near_tie(solo, fast.token_ids))
    assert accepted > 0  # guesses were verified several at a time
    if exact_paths(engine):
        assert parted == [None] * len(parted)
    print(f"int4 {mode} answers parting from plain greedy at:", parted)


@pytest.fixture(scope="module")
def exact_engine(int4_model_dir):
    engine = Engine.load(int4_model_dir, EngineConfig(intra_op_threads=1, max_batch=2))
    if not exact_paths(engine):
        pytest.skip("the engine's kernels do not run every node here (not built?)")
    return engine


def test_by_default_greedy_answers_guess_by_prompt_lookup_and_stay_plain_greedys(
        genai_model_dir):
    """The default ("auto") speculates where a verify pass gives each row a single step's
    bits (the engine's kernels run every node): the answer is the plain one, in fewer
    passes where the prompt holds what it writes."""
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    if not exact_paths(engine):
        pytest.skip("the engine's kernels do not run every node here (not built?)")
    plain = _run(engine, PATTERN, "none", n=24)
    auto = _run(engine, PATTERN, "auto", n=24)
    assert auto.token_ids == plain.token_ids and plain.speculation is None
    assert auto.speculation is not None and auto.speculation.accepted > 0
    assert auto.speculation.forwards < len(auto.token_ids) - 1


def test_auto_pauses_after_failed_guesses(exact_engine):
    """Guesses that keep failing cost a wider pass each: the default waits 1, 2, 4 ... steps
    after each failure, explicit prompt lookup does not; both answer as plain greedy (int4,
    blocks of 128: the engine's MatMulNBits)."""
    rng = np.random.default_rng(2024)
    auto_proposed = lookup_proposed = 0
    for _ in range(6):
        q = rng.integers(1, 2000, size=int(rng.integers(3, 10))).tolist()
        prompt = [*q, *_run(exact_engine, q, "none", n=12).token_ids, *q]
        plain = _run(exact_engine, prompt, "none", n=24)
        auto = _run(exact_engine, prompt, "auto", n=24)
        lookup = _run(exact_engine, prompt, "prompt_lookup", n=24)
        assert auto.token_ids == lookup.token_ids == plain.token_ids
        assert auto.speculation is not None and lookup.speculation is not None
        auto_proposed += auto.speculation.proposed
        lookup_proposed += lookup.speculation.proposed
    assert 0 < auto_proposed < lookup_proposed


def test_default_requests_decode_together_in_a_batch(exact_engine):
    """A sequence in auto mode joins the scheduler's batch (a batched step is a plain step):
    concurrent users keep sharing one read of the weights."""
    scheduler = Scheduler(exact_engine)
    results: list = [None, None]

    def sink(i: int) -> Callable[[Any], None]:
        return lambda item: results.__setitem__(i, item)

    for i, prompt in enumerate((PATTERN, [9, 8, 7] * 10)):
        request = GenerateRequest(token_ids=tuple(prompt), options=GenerateOptions(
            max_new_tokens=16, temperature=0.0, stop_on_eos=False))
        scheduler.submit(request, sink(i))
    while scheduler.step():
        pass
    assert scheduler.batched_steps > 0
    assert results[0].result.token_ids == _run(exact_engine, PATTERN, "none", n=16).token_ids
