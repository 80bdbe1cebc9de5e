"""Reuse by shifting: cached runs found at other positions keep their KV, keys re-rotated.

On a one-layer model a token's KV depends on the token and its position alone, so a
shifted key must equal the recomputed one and the answers must be the same; on deeper
models the shifted KV still carries the context it was computed in (the measured
agreement is in docs/kv-and-scheduling.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from tests.forge import ForgeSpec, write_genai_model, write_optimum_model

ONE_LAYER = ForgeSpec(layers=1, context=1024)
DEEP = ForgeSpec(layers=2, context=1024)
MIN_RUN = 32
#: A 900-token "document" of random ids (no 16 of them repeat in order).
DOC = [int(i) for i in np.random.default_rng(1).integers(9, 500, 900)]


def _opts(n: int = 12) -> GenerateOptions:
    return GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=n)


def _run(engine: Engine, ids: list[int], n: int = 12):
    return engine.generate(GenerateRequest(token_ids=tuple(ids), options=_opts(n)))


def _shift_info(engine: Engine) -> dict[str, Any]:
    described = engine.describe()["kv_shift"]
    assert isinstance(described, dict)
    return described


def _cold(folder: Path) -> Engine:
    return Engine.load(folder, EngineConfig(intra_op_threads=1, prefix_cache=False))


@pytest.fixture(scope="module", params=["genai", "optimum"])
def one_layer(request, tmp_path_factory) -> Path:
    write = write_genai_model if request.param == "genai" else write_optimum_model
    return write(tmp_path_factory.mktemp(f"one-layer-{request.param}"), ONE_LAYER)


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Path:
    return write_genai_model(tmp_path_factory.mktemp("deep"), DEEP)


# --- the rotation ---------------------------------------------------------------------


def _tables(positions: int, dim: int, theta: float = 10000.0, magnitude: float = 1.0):
    inv = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    angles = np.outer(np.arange(positions), inv)
    return magnitude * np.cos(angles), magnitude * np.sin(angles)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """What the model does to a key at the positions of `cos`/`sin` rows."""
    out = x.astype(np.float64).copy()
    rot = 2 * cos.shape[1]
    i1 = slice(0, rot, 2) if interleaved else slice(0, rot // 2)
    i2 = slice(1, rot, 2) if interleaved else slice(rot // 2, rot)
    a, b = out[..., i1].copy(), out[..., i2].copy()
    out[..., i1] = a * cos - b * sin
    out[..., i2] = a * sin + b * cos
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [32, 16])  # full and partial (head dim 32)
@pytest.mark.parametrize("magnitude", [1.0, 1.3])  # 1.3: a YaRN-style scaled table
def test_a_shifted_key_equals_the_key_computed_at_its_new_position(interleaved, rotary_dim,
                                                                   magnitude):
    from engine.model.rotary import KeyRotation

    cos, sin = _tables(300, rotary_dim, magnitude=magnitude)
    unit = np.sqrt(cos * cos + sin * sin)
    rotation = KeyRotation(cos / unit, sin / unit, interleaved, "test")
    raw = np.random.default_rng(0).standard_normal((2, 40, 32)).astype(np.float32)
    at_old = _rotate(raw, cos[200:240], sin[200:240], interleaved).astype(np.float32)
    at_new = _rotate(raw, cos[7:47], sin[7:47], interleaved)
    moved = rotation.shift(at_old, 200, 7)
    assert moved.dtype == np.float32
    np.testing.assert_allclose(moved, at_new, rtol=0, atol=2e-5)
    np.testing.assert_array_equal(moved[..., rotary_dim:], raw[..., rotary_dim:])
    back = rotation.shift(moved, 7, 200)  # and forward again
    np.testing.assert_allclose(back, at_old, rtol=0, atol=2e-5)


def test_float16_keys_are_rotated_in_float32_and_rounded_once():
    """A float16 cache's keys (engine.model.kv16_pass) come back float16, the rotation done
    in float32 and rounded once: within two units in the last place of the key computed
    at the new position and rounded there."""
    from engine.model.rotary import KeyRotation

    cos, sin = _tables(300, 32)
    rotation = KeyRotation(cos, sin, False, "test")
    raw = np.random.default_rng(0).standard_normal((2, 40, 32)).astype(np.float32)
    at_old = _rotate(raw, cos[200:240], sin[200:240], False).astype(np.float16)
    moved = rotation.shift(at_old, 200, 7)
    assert moved.dtype == np.float16
    np.testing.assert_array_equal(
        moved, rotation.shift(at_old.astype(np.float32), 200, 7).astype(np.float16))
    at_new = _rotate(raw, cos[7:47], sin[7:47], False).astype(np.float16)
    _assert_within_ulps(moved, at_new, 2)


def _assert_within_ulps(got: np.ndarray, want: np.ndarray, ulps: int, atol: float = 1e-4,
                        what: str = "") -> None:
    """float16 arrays: within `ulps` units in the last place of each vector's largest
    value in `want` (a rotation mixes a vector's values: its error follows them, not the
    result's, which may be small); float32: `atol`."""
    if want.dtype != np.float16:
        np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=what)
        return
    assert got.dtype == np.float16, what
    unit = np.spacing(np.abs(want).max(axis=-1, keepdims=True)).astype(np.float32)
    diff = np.abs(got.astype(np.float32) - want.astype(np.float32))
    assert float((diff - ulps * unit).max()) <= 0, (what, float(diff.max()))


# --- the matcher ----------------------------------------------------------------------


def test_runs_are_found_in_order_with_the_gaps_between_them():
    from engine.kv.shift import Segment, match_runs

    cached = list(range(1000, 1300))
    # header kept, 100 tokens left out, a new 5-token part, then more of the cached text
    prompt = cached[:10] + cached[110:200] + [1, 2, 3, 4, 5] + cached[200:290] + [7, 8]
    runs = match_runs(cached, prompt, prefix=10, limit=len(prompt) - 1, min_run=32)
    assert runs == [Segment(10, 90, 110), Segment(100, 5, None), Segment(105, 90, 200)]
    # runs shorter than the minimum are not taken
    assert match_runs(cached, prompt, prefix=10, limit=len(prompt) - 1, min_run=91) == []


# --- shifted KV against recomputed KV -------------------------------------------------


def _kv_of(folder: Path, ids: list[int], kv_dtype: str = "auto") -> list[np.ndarray]:
    engine = Engine.load(folder, EngineConfig(intra_op_threads=1, prefix_cache=False,
                                              kv_dtype=kv_dtype))
    runner = engine.runner
    runner.reserve(len(ids))
    runner.forward(np.array(ids, dtype=np.int64))
    return runner.export_kv(0, len(ids))


@pytest.mark.parametrize("kv_dtype", ["auto", "float32"])  # auto: float16 where it applies
def test_shifted_kv_equals_recomputed_kv_on_a_one_layer_model(one_layer, kv_dtype):
    from engine.kv.shift import Segment

    engine = Engine.load(one_layer, EngineConfig(intra_op_threads=1, cache_reuse=MIN_RUN,
                                                 kv_dtype=kv_dtype))
    shifter = engine.reuse.shifter
    assert shifter is not None, engine.describe()["kv_shift"]
    run = DOC[100:180]
    old = _kv_of(one_layer, DOC[:100] + run, kv_dtype)  # the run at positions 100..180
    new = _kv_of(one_layer, DOC[300:330] + run, kv_dtype)  # the same run at 30..110
    plan = shifter.copy([Segment(30, len(run), 100)], lambda a, b: [r[:, a:b] for r in old])
    for pair, moved, fresh in zip(engine.spec.kv_pairs, plan.rows[0], new, strict=True):
        # float16: the source key was rounded at its old position, then rotated and rounded
        # again: two roundings where the recomputed key had one
        _assert_within_ulps(moved, fresh[:, 30:], 2, what=f"{pair.kind} of layer {pair.layer}")


def test_deeper_layers_keep_the_context_a_shifted_run_was_computed_in(deep):
    from engine.kv.shift import Segment

    # float32 KV: the context's mark on layer 1 is measured against float32's rounding
    engine = Engine.load(deep, EngineConfig(intra_op_threads=1, cache_reuse=MIN_RUN,
                                            kv_dtype="float32"))
    shifter = engine.reuse.shifter
    assert shifter is not None
    run = DOC[100:180]
    old = _kv_of(deep, DOC[:100] + run, "float32")
    new = _kv_of(deep, DOC[300:330] + run, "float32")
    plan = shifter.copy([Segment(30, len(run), 100)], lambda a, b: [r[:, a:b] for r in old])
    errors = {(p.layer, p.kind): float(np.abs(moved - fresh[:, 30:]).max())
              for p, moved, fresh in zip(engine.spec.kv_pairs, plan.rows[0], new, strict=True)}
    assert errors[(0, "key")] < 1e-4 and errors[(0, "value")] < 1e-4  # token and position
    assert errors[(1, "key")] > 1e-3  # layer 1 saw the 100 tokens before the run, not 30


# --- answers and counts ---------------------------------------------------------------


def test_oldest_part_left_out_reuses_the_rest_and_answers_as_a_recompute(one_layer):
    warm = Engine.load(one_layer, EngineConfig(intra_op_threads=1))  # cache_reuse 256
    _run(warm, DOC[:700])
    # the first 4 tokens (a header) kept, the next 300 left out, 20 new tokens at the end
    second = DOC[:4] + DOC[304:720]
    result = _run(warm, second)
    assert result.prefix_cache_hit_len == 4 + 396  # only the 20 new tokens were prefilled
    assert result.token_ids == _run(_cold(one_layer), second).token_ids


def test_an_edit_inside_the_prompt_computes_the_edit_and_shifts_what_follows(one_layer):
    warm = Engine.load(one_layer, EngineConfig(intra_op_threads=1))
    _run(warm, DOC[:700])
    # three tokens replaced by five at 150: what follows moves two positions on
    edited = DOC[:150] + [1, 2, 3, 4, 5] + DOC[153:700]
    result = _run(warm, edited)
    # prefilled: the five new tokens, and the last one (a prompt's last token always runs)
    assert len(edited) - result.prefix_cache_hit_len == 5 + 1
    assert result.token_ids == _run(_cold(one_layer), edited).token_ids


def test_an_editor_window_moved_by_a_chunk_prefills_only_the_new_part(one_layer):
    warm = Engine.load(one_layer, EngineConfig(intra_op_threads=1))
    window, chunk = 600, 128
    _run(warm, DOC[:window])
    moved = DOC[chunk:chunk + window]
    result = _run(warm, moved)
    assert result.prefix_cache_hit_len == window - chunk
    assert len(moved) - result.prefix_cache_hit_len == chunk  # the new lines only
    assert result.token_ids == _run(_cold(one_layer), moved).token_ids


def test_a_deeper_model_reuses_the_same_runs(deep):
    """(How close its answers stay to a recompute depends on the model: bench/shift_reuse.py
    measures the built-in one.)"""
    warm = Engine.load(deep, EngineConfig(intra_op_threads=1))
    _run(warm, DOC[:700])
    second = DOC[:4] + DOC[304:720]
    assert _run(warm, second).prefix_cache_hit_len == 400


def test_cache_reuse_0_turns_shifting_off(one_layer):
    warm = Engine.load(one_layer, EngineConfig(intra_op_threads=1, cache_reuse=0))
    assert _shift_info(warm)["shift"] is False
    _run(warm, DOC[:700])
    result = _run(warm, DOC[:4] + DOC[304:720])
    assert result.prefix_cache_hit_len == 4


@pytest.mark.parametrize("config", [
    {"model_type": "gpt2"},  # absolute position embeddings
    {"model_type": "qwen2", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
])
def test_shifting_is_refused_where_the_rotation_cannot_be_derived(tmp_path, config):
    folder = write_optimum_model(tmp_path / "m", ONE_LAYER)
    path = folder / "config.json"
    declared = json.loads(path.read_text())
    declared.update(config)
    path.write_text(json.dumps(declared))
    warm = Engine.load(folder, EngineConfig(intra_op_threads=1, cache_reuse=MIN_RUN))
    described = _shift_info(warm)
    assert described["shift"] is False and described["reason"]
    _run(warm, DOC[:700])
    assert _run(warm, DOC[:4] + DOC[304:720]).prefix_cache_hit_len == 4  # recomputed


def test_bad_cache_reuse_is_refused_with_the_fix():
    with pytest.raises(Exception, match="cache_reuse"):
        EngineConfig(cache_reuse=-1)



def test_declared_kv_pairs_named_past_key_values_are_told_apart(static_model_dir):
    """(`past_key_values.0.key` holds "value": it was read as a value, so no key was known
    to rotate.)"""
    engine = Engine.load(static_model_dir, EngineConfig(intra_op_threads=1))
    kinds = [(p.input.rsplit(".", 1)[-1], p.kind) for p in engine.spec.kv_pairs]
    assert kinds and all(name == kind for name, kind in kinds)
    assert _shift_info(engine)["shift"] is False  # no tables, no config.json


def test_a_sessions_set_aside_kv_is_shifted_then_released(one_layer):
    """The session path: the KV past the common prefix is kept aside for one turn, shifted
    into the new prompt even when the runner went on to other work, then let go."""
    engine = Engine.load(one_layer, EngineConfig(intra_op_threads=1, kv_page_size=16))
    session = engine.sessions.get(engine.create_session())
    engine.generate_in_session(session.id, GenerateRequest(token_ids=tuple(DOC[:700]),
                                                          options=_opts()))
    _run(engine, DOC[720:740])  # another request takes the runner
    engine.sessions.set_aside(session, 4)  # what a chat turn does with the oldest part gone
    assert session.aside is not None and session.tokens == DOC[:4]
    result = engine.generate_in_session(session.id, GenerateRequest(
        token_ids=tuple(DOC[304:720]), options=_opts()))
    assert result.prefix_cache_hit_len == 4 + 396
    assert session.aside is None
    engine.close_session(session.id)
    assert engine.prefix_cache is not None
    engine.prefix_cache.evict(engine.pool.allocated_pages)
    assert engine.pool.allocated_pages == 0  # no page kept by a forgotten reference


def test_the_scheduler_picks_the_runner_holding_a_moved_window(one_layer):
    engine = Engine.load(one_layer, EngineConfig(intra_op_threads=1))
    assert engine.add_runner() is not None
    window, chunk = 600, 128
    for runner, ids in zip(engine.runners, ([5, 6, 7, 8] * 20, DOC[:window]), strict=True):
        runner.reserve(len(ids))
        runner.forward(np.array(ids, dtype=np.int64))  # runner 1 holds the old window
    moved = DOC[chunk:chunk + window]
    request = GenerateRequest(token_ids=tuple(moved), options=_opts())
    *_, last = engine.scheduler.stream(request)
    assert last.result is not None
    assert last.result.prefix_cache_hit_len == window - chunk
