"""KV reuse is token-identical to full recompute, on every decode-path layout."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.kv.reuse import common_prefix_len

BASE = [(7 * i + 3) % 400 + 9 for i in range(70)]


def _opts(n=16, **kw):
    return GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=n, **kw)


def _run(engine, ids, n=16):
    return engine.generate(GenerateRequest(token_ids=tuple(ids), options=_opts(n)))


@pytest.fixture(scope="module", params=["genai", "optimum", "static"])
def pair(request, genai_model_dir, optimum_model_dir, static_model_dir):
    folder = {"genai": genai_model_dir, "optimum": optimum_model_dir,
              "static": static_model_dir}[request.param]
    small = request.param == "static"  # the static cache holds 64 tokens
    warm = Engine.load(folder, EngineConfig(intra_op_threads=1, kv_page_size=8))
    cold = Engine.load(folder, EngineConfig(intra_op_threads=1, prefix_cache=False))
    return warm, cold, (BASE[:30] if small else BASE)


def _cold(cold, ids, n=16):
    cold.runner.reset()
    return _run(cold, ids, n)


def test_prefix_reuse_matches_recompute_and_reports_hits(pair):
    warm, cold, base = pair
    first = _run(warm, base)
    assert first.token_ids == _cold(cold, base).token_ids
    # same prompt again: everything but the last token is reused
    again = _run(warm, base)
    assert again.prefix_cache_hit_len == len(base) - 1
    assert again.token_ids == first.token_ids
    # diverging inside a page: live reuse up to the divergence
    edited = base[:21] + [5] + base[22:]
    result = _run(warm, edited)
    assert result.prefix_cache_hit_len == 21
    assert result.token_ids == _cold(cold, edited).token_ids


def test_prefix_cache_serves_after_another_request_took_the_runner(pair):
    warm, cold, base = pair
    _run(warm, base)
    _run(warm, [11, 12, 13, 14])  # the runner now holds something else
    result = _run(warm, base[:-1] + [99])
    page = warm.pool.page_size
    assert result.prefix_cache_hit_len == (len(base) - 1) // page * page
    assert result.token_ids == _cold(cold, base[:-1] + [99]).token_ids


def test_sessions_persist_context_and_prefill_only_new_tokens(pair):
    warm, cold, base = pair
    sid = warm.create_session()
    history: list[int] = []
    turns = [base[i:i + 3] for i in range(0, 30, 3)]  # ten turns of three new tokens
    for turn in turns:
        result = warm.generate_in_session(sid, GenerateRequest(token_ids=tuple(turn),
                                                                options=_opts(2)))
        prompt = history + turn
        assert result.prompt_tokens == len(prompt)
        if history:  # only the new tokens are prefilled
            assert result.prompt_tokens - result.prefix_cache_hit_len == len(turn)
        assert result.token_ids == _cold(cold, prompt, 2).token_ids
        history = prompt + list(result.token_ids)
        _run(warm, [1, 2, 3])  # another request between turns takes the runner
    assert warm.session_token_count(sid) == len(history)
    warm.close_session(sid)


def test_rewind_and_fork_sessions_match_recompute(pair):
    warm, cold, base = pair
    sid = warm.create_session()
    warm.generate_in_session(sid, GenerateRequest(token_ids=tuple(base[:20]),
                             options=_opts(6)))
    warm.rewind_session(sid, 6)  # regenerate the answer
    assert warm.session_token_count(sid) == 20
    redo = warm.generate_in_session(sid, GenerateRequest(token_ids=(base[20],),
                                                          options=_opts(6)))
    assert redo.token_ids == _cold(cold, base[:21], 6).token_ids
    child = warm.fork_session(sid)
    history = base[:21] + list(redo.token_ids)
    a = warm.generate_in_session(sid, GenerateRequest(token_ids=(40, 41), options=_opts(5)))
    b = warm.generate_in_session(child, GenerateRequest(token_ids=(50,), options=_opts(5)))
    assert a.token_ids == _cold(cold, history + [40, 41], 5).token_ids
    assert b.token_ids == _cold(cold, history + [50], 5).token_ids
    assert b.prefix_cache_hit_len >= len(history) - 1
    for s in (sid, child):
        warm.close_session(s)


def test_session_stops_at_explicit_context_length(genai_model_dir):
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    sid = engine.create_session()
    result = engine.generate_in_session(sid, GenerateRequest(token_ids=(2, 4, 3), options=_opts(
        32, max_context=16)))
    assert len(result.token_ids) == 13 and str(result.finish_reason) == "length"
    assert engine.session_token_count(sid) == 16
    engine.close_session(sid)
    assert len(engine.sessions) == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=1200), st.integers(0, 1200),
       st.lists(st.integers(0, 3), max_size=40), st.integers(0, 1300))
def test_the_shared_prefix_is_the_first_difference_within_the_limit(base, cut, tail, limit):
    # (blocks of ids compared at once, then one by one: the answer is the plain loop's,
    # wherever the difference falls, block boundaries included)
    a, b = base, base[:cut] + tail
    expected = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                    min(len(a), len(b)))
    assert common_prefix_len(a, tuple(b), limit) == min(expected, limit)
    assert common_prefix_len(tuple(b), a, limit) == min(expected, limit)
