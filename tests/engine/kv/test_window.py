"""Sliding-window attention with attention sinks, declared in a model's own metadata.

The KV keeps the first tokens and the most recent ones (engine.kv.window): a sequence runs
past the model's context in bounded memory, the dropped tokens' places taken by the kept
ones with their keys re-rotated. Real forged models (GroupQueryAttention with its own
rotary tables; an optimum-style graph rotating with standard operators) run on ONNX
Runtime; nothing is mocked.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.errors import ModelLoadError
from engine.kv.window import WindowedRunner
from tests.forge import ForgeSpec, write_genai_model, write_optimum_model

WINDOW, SINKS = 64, 4
ROWS = WINDOW + SINKS
CONTEXT = 256
#: A prompt longer than the model's context, of random ids (no n-gram repeats much).
PROMPT = [int(i) for i in np.random.default_rng(7).integers(9, 500, 300)]


def _metadata(folder: Path, spec: ForgeSpec, *, window: int | None = WINDOW,
              sinks: int | None = SINKS, context: int = CONTEXT) -> Path:
    """Turn a forged folder into one with our own metadata declaring the window."""
    (folder / "genai_config.json").unlink(missing_ok=True)
    lines = ["inference_metadata_version: 1", "model_file: model.onnx",
             f"max_sequence_length: {context}", "eos_token_ids: [2]",
             f"head_size: {spec.hd}", f"kv_num_heads: {spec.kv_heads}"]
    if window is not None:
        lines.append(f"sliding_window: {window}")
    if sinks is not None:
        lines.append(f"attention_sinks: {sinks}")
    (folder / "inference_metadata.yaml").write_text("\n".join(lines) + "\n")
    return folder


def _forge(root: Path, kind: str, layers: int) -> tuple[Path, ForgeSpec]:
    spec = ForgeSpec(layers=layers, context=CONTEXT)
    write = write_genai_model if kind == "genai" else write_optimum_model
    return write(root / f"{kind}-{layers}", spec), spec


@pytest.fixture(scope="module", params=["genai", "optimum"])
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def windowed(kind, tmp_path_factory) -> Path:
    folder, spec = _forge(tmp_path_factory.mktemp("windowed"), kind, 2)
    return _metadata(folder, spec)


def _opts(n: int = 40, **kw) -> GenerateOptions:
    return GenerateOptions(temperature=0.0, stop_on_eos=False, max_new_tokens=n, **kw)


def _load(folder: Path, **kw) -> Engine:
    return Engine.load(folder, EngineConfig(intra_op_threads=1, **kw))


def test_a_declared_window_answers_past_the_models_context_in_bounded_memory(windowed):
    engine = _load(windowed, prefix_cache=False)
    kv = engine.describe()["kv"]
    assert isinstance(kv, dict)
    assert kv["window"] == {"attention_sinks": SINKS, "sliding_window": WINDOW,
                      "drop": WINDOW // 8, "kv_rows": ROWS}
    result = engine.generate(GenerateRequest(token_ids=tuple(PROMPT), options=_opts(60)))
    assert len(PROMPT) + 60 > CONTEXT  # the sequence outgrew the model's positions
    assert result.finish_reason.kind != "length" and len(result.token_ids) == 60
    held = engine.runner.kv_runner
    assert held.length <= ROWS
    assert engine.runner.length == len(PROMPT) + 59  # the last token is never fed
    # the memory stays that of the window, not of the sequence
    assert held.kv_bytes <= 2 * ROWS * engine.spec.kv_bytes_per_token
    assert held.tokens[:SINKS] == PROMPT[:SINKS]  # the sinks stay
    assert held.tokens[-1] == result.token_ids[-2]  # the newest stay


@pytest.mark.parametrize("kind_", ["genai", "optimum"])
def test_on_one_layer_a_windowed_step_equals_a_fresh_run_of_the_kept_tokens(kind_, tmp_path):
    """With one layer a token's KV depends on the token and its position alone: after
    drops and re-rotation the cache must be what a fresh run of the kept tokens gives."""
    folder, spec = _forge(tmp_path, kind_, 1)
    plain = _load(folder, prefix_cache=False, kv_dtype="float32")
    windowed = _load(_metadata(Path(shutil.copytree(folder, tmp_path / "w")), spec),
                     prefix_cache=False, kv_dtype="float32")
    runner = windowed.runner
    assert isinstance(runner, WindowedRunner)
    logits = runner.forward(np.array(PROMPT[:200], dtype=np.int64))
    assert runner.drops > 0 and runner.length == 200
    kept = list(runner.kv_runner.tokens)
    assert len(kept) <= ROWS and kept[:SINKS] == PROMPT[:SINKS] and kept[-1] == PROMPT[199]
    fresh = plain.runner.forward(np.array(kept, dtype=np.int64))
    np.testing.assert_allclose(logits, fresh, atol=2e-4, rtol=0)
    assert int(np.argmax(logits)) == int(np.argmax(fresh))


def _answer(engine: Engine, ids: list[int], **kw) -> tuple[int, ...]:
    return engine.generate(GenerateRequest(token_ids=tuple(ids), options=_opts(**kw))).token_ids


def test_a_windowed_answer_is_the_same_whatever_the_path(windowed):
    """Tokens leave at fixed places of the sequence, so chunking, a repeat through the
    caches, a session's turns and speculation all give the one answer."""
    first = _answer(_load(windowed, prefix_cache=False), PROMPT, speculative_mode="none")
    assert _answer(_load(windowed, prefix_cache=False, prefill_chunk_size=7), PROMPT,
                   speculative_mode="none") == first
    engine = _load(windowed)
    assert _answer(engine, PROMPT, speculative_mode="none") == first
    repeat = engine.generate(GenerateRequest(token_ids=tuple(PROMPT),
                                             options=_opts(speculative_mode="none")))
    assert repeat.token_ids == first
    assert 0 < repeat.prefix_cache_hit_len <= ROWS  # the sinks' exact rows, no more
    looked_up = _answer(engine, PROMPT, speculative_mode="prompt_lookup")
    assert looked_up == first
    # a session: turn 2 continues the window turn 1 left; a single request on the
    # whole history gives the same answer
    session = engine.create_session()
    turn1 = engine.generate_in_session(session, GenerateRequest(
        token_ids=tuple(PROMPT[:150]), options=_opts(20, speculative_mode="none")))
    turn2 = engine.generate_in_session(session, GenerateRequest(
        token_ids=tuple(PROMPT[150:]), options=_opts(speculative_mode="none")))
    history = PROMPT[:150] + list(turn1.token_ids) + PROMPT[150:]
    assert _answer(_load(windowed, prefix_cache=False), history,
                   speculative_mode="none") == turn2.token_ids


def test_a_window_without_drops_answers_as_the_model_without_one(tmp_path):
    folder, spec = _forge(tmp_path, "genai", 2)
    plain = _load(folder, prefix_cache=False)
    windowed = _load(_metadata(Path(shutil.copytree(folder, tmp_path / "w")), spec),
                     prefix_cache=False)
    short = PROMPT[:20]
    assert _answer(windowed, short) == _answer(plain, short)  # 60 tokens: within the rows
    assert isinstance(windowed.runner, WindowedRunner) and windowed.runner.drops == 0


@pytest.mark.parametrize(("window", "sinks", "context", "match"), [
    (8, 0, CONTEXT, "at least 16"),
    (64, 64, CONTEXT, "attention_sinks must be"),
    (250, 10, CONTEXT, "exceed max_sequence_length"),
    (None, 4, CONTEXT, "without sliding_window"),
    ("wide", 4, CONTEXT, "whole number"),
])
def test_window_values_the_engine_cannot_run_are_clear_errors(tmp_path, window, sinks, context,
                                                               match):
    folder, spec = _forge(tmp_path, "genai", 1)
    _metadata(folder, spec, window=window, sinks=sinks, context=context)
    with pytest.raises(ModelLoadError, match=match) as err:
        _load(folder)
    assert err.value.hint


def test_a_window_on_a_model_whose_key_rotation_is_unknown_is_refused(tmp_path):
    folder, spec = _forge(tmp_path, "optimum", 1)
    (folder / "config.json").unlink()  # the rotation came from its rope_theta
    _metadata(folder, spec)
    with pytest.raises(ModelLoadError, match="cannot move its keys") as err:
        _load(folder)
    assert "rotary" in (err.value.hint or "")


def test_windowed_requests_preempted_and_run_together_match_their_solo_answers(windowed):
    """A high-priority request parks a running windowed one past its first drop; that one
    resumes (the sinks' rows from pages, the rest recomputed with the same drops) and every
    answer is its solo one."""
    from engine.scheduling.scheduler import Scheduler
    from tests.engine.test_scheduler import Collector, _drain

    solo = _load(windowed, prefix_cache=False)
    requests = [GenerateRequest(token_ids=tuple(p), options=_opts(30, speculative_mode="none"))
                for p in (PROMPT, PROMPT[50:], PROMPT[:40])]
    expected = [solo.generate(r).token_ids for r in requests]
    engine = _load(windowed, max_batch=2)
    scheduler = Scheduler(engine)
    low = [Collector(), Collector()]
    for request, sink in zip(requests[:2], low, strict=True):
        scheduler.submit(request, sink, priority="low")
    while not (len(engine.runners) == 2 and all(isinstance(r, WindowedRunner) and r.drops
                                                for r in engine.runners)):
        scheduler.step()
    urgent = Collector()
    scheduler.submit(requests[2], urgent, priority="high")
    _drain(scheduler)
    assert scheduler.preempted_total == 1
    assert [s.result.token_ids for s in (*low, urgent)] == expected


def test_a_context_shift_lets_any_rotary_model_answer_past_its_context(tmp_path):
    """`context_shift=N`: the model's own context becomes the window (N first tokens kept);
    within the context the answer is the model's without it."""
    folder, _ = _forge(tmp_path, "genai", 2)
    plain = _load(folder, prefix_cache=False)
    shifted = _load(folder, prefix_cache=False, context_shift=4)
    runner = shifted.runner
    assert isinstance(runner, WindowedRunner) and runner.window is not None
    assert (runner.window.sinks, runner.window.rows) == (4, CONTEXT)
    short = PROMPT[:100]
    assert _answer(shifted, short) == _answer(plain, short) and runner.drops == 0
    ended = plain.generate(GenerateRequest(token_ids=tuple(PROMPT[:200]),
                                           options=_opts(100)))
    assert ended.finish_reason.kind == "length" and len(ended.token_ids) < 100  # the context
    longer = shifted.generate(GenerateRequest(token_ids=tuple(PROMPT[:200]),
                                              options=_opts(100)))
    assert len(longer.token_ids) == 100 and runner.drops > 0
    assert longer.token_ids[:len(ended.token_ids)] == ended.token_ids  # the same up to it


def test_a_context_shift_keeping_more_than_half_the_context_is_refused(tmp_path):
    folder, _ = _forge(tmp_path, "genai", 1)
    with pytest.raises(ModelLoadError, match="at most half") as err:
        _load(folder, context_shift=200)
    assert "--context-shift" in (err.value.hint or "")
