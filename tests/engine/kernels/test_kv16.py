"""Float16 KV on the CPU (engine.model.kv16_pass): where the engine's kernel runs attention,
the live cache, sessions, the prefix cache and the tiered store hold 16-bit keys and values,
half the bytes of float32, and an answer is still the same whatever its path. Int8 KV
(`kv_dtype="int8"`, a scale per token and KV head) and int16 KV (whole numbers and a scale,
test_kv_int16.py) go through the same paths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest, kernels
from engine.config import KVStoreConfig
from engine.errors import InvalidOptionError
from engine.model.graph_passes import KERNEL_DOMAIN, own_attention
from engine.model.kv16_pass import F16_OP, half_kv
from engine.scheduling.scheduler import Scheduler

built = pytest.mark.skipif(kernels.library() is None,
                           reason="the engine's kernels were not built (no C compiler)")
#: The most a float16 cache moved a forged model's logits from a float32 cache's, over
#: the logits' largest magnitude (measured: 6.2e-4 on genai_model_dir, 200 + 40 tokens).
F16_DRIFT = 2e-3


def _load(folder: Path, **config: Any) -> Engine:
    return Engine.load(folder, EngineConfig(intra_op_threads=2, **config))


def _greedy(ids: tuple[int, ...], n: int = 16, **options: Any) -> GenerateRequest:
    return GenerateRequest(token_ids=ids, options=GenerateOptions(
        max_new_tokens=n, temperature=0.0, stop_on_eos=False, **options))


# --- the pass -------------------------------------------------------------------------------


def test_the_pass_retypes_past_and_present_to_float16_and_moves_to_the_f16_operator(
        genai_model_dir):
    moved = own_attention((genai_model_dir / "model.onnx").read_bytes())
    assert moved is not None
    halved, why = half_kv(moved)
    assert why is None and halved is not None
    model = onnx.load_from_string(halved)
    kv_in = {i.name: i.type.tensor_type.elem_type for i in model.graph.input
             if i.name.startswith("past")}
    kv_out = {o.name: o.type.tensor_type.elem_type for o in model.graph.output
              if o.name.startswith("present")}
    assert len(kv_in) == len(kv_out) == 4
    assert set(kv_in.values()) == set(kv_out.values()) == {TensorProto.FLOAT16}
    logits = next(o for o in model.graph.output if o.name == "logits")
    assert logits.type.tensor_type.elem_type == TensorProto.FLOAT  # the rest is untouched
    attention = [n for n in model.graph.node if "GroupQueryAttention" in n.op_type]
    assert [(n.op_type, n.domain) for n in attention] == [(F16_OP, KERNEL_DOMAIN)] * 2


def _graph(*, reader: str | None = None, second_domain: str = KERNEL_DOMAIN) -> bytes:
    """Two attention nodes in the kernel's domain (the second in `second_domain`), and a
    `reader` node of the first past key when given."""
    inputs, nodes, outputs = [], [], []
    for layer, domain in ((0, KERNEL_DOMAIN), (1, second_domain)):
        pk, pv = f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 8, 16])
                   for n in (pk, pv)]
        nodes.append(helper.make_node(
            "GroupQueryAttention", ["q", "", "", pk, pv, "sl", "tl"],
            [f"o{layer}", f"present.{layer}.key", f"present.{layer}.value"], domain=domain,
            num_heads=1, kv_num_heads=1))
        outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                    for n in (f"o{layer}", f"present.{layer}.key", f"present.{layer}.value")]
    inputs += [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 1, 16]),
               helper.make_tensor_value_info("sl", TensorProto.INT32, [1]),
               helper.make_tensor_value_info("tl", TensorProto.INT32, [])]
    if reader is not None:
        nodes.append(helper.make_node(reader, ["past_key_values.0.key"], ["seen"]))
        outputs.append(helper.make_tensor_value_info("seen", TensorProto.FLOAT, None))
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs))
    return model.SerializeToString()


@pytest.mark.parametrize(("graph", "why"), [
    (lambda: _graph(reader="Identity"), "a Identity node reads the past KV"),
    (lambda: _graph(second_domain="com.microsoft"),
     "not every GroupQueryAttention node runs the engine's kernel"),
])
def test_a_graph_whose_kv_is_not_all_the_kernels_keeps_float32_and_says_why(graph, why):
    assert half_kv(graph()) == (None, why)


def test_a_shape_of_the_past_does_not_stop_the_pass():
    halved, why = half_kv(_graph(reader="Shape"))
    assert why is None and halved is not None


def test_the_kv_dtype_option_is_checked():
    with pytest.raises(InvalidOptionError, match="kv_dtype: expected one of auto, float16, "
                                                 "float32, int8, int16, got 'bf16'"):
        EngineConfig(kv_dtype="bf16")


def test_float16_asked_for_where_the_kernel_does_not_run_is_a_clear_error(genai_model_dir):
    with pytest.raises(InvalidOptionError, match="float16 KV cache cannot be kept .*"
                                                 "turned off by own_kernels=False") as err:
        _load(genai_model_dir, kv_dtype="float16", own_kernels=False)
    assert "auto" in (err.value.hint or "")


# --- the engine -----------------------------------------------------------------------------


@built
def test_the_engine_keeps_float16_kv_at_half_the_bytes_of_float32(genai_model_dir):
    half, full = _load(genai_model_dir), _load(genai_model_dir, kv_dtype="float32")
    assert {p.dtype for p in half.spec.kv_pairs} == {"float16"}
    assert {p.dtype for p in full.spec.kv_pairs} == {"float32"}
    assert 2 * half.spec.kv_bytes_per_token == full.spec.kv_bytes_per_token
    assert half.describe()["kv"] == {"dtype": "float16", "window": None,
                                     "bytes_per_token": half.spec.kv_bytes_per_token}
    assert half.kernel_use is not None and half.kernel_use.kv_dtype == "float16"
    assert half.kernel_use.kv_line() == "KV cache float16"
    assert full.kernel_use is not None and \
        full.kernel_use.kv_reason == "kv_dtype float32 asked for"
    # the governor counts pages of the real size: twice the tokens in the same bytes
    assert 2 * half.pool.geometry.page_bytes(32) == full.pool.geometry.page_bytes(32)
    budget = half.governor.budget()
    assert budget is not None and budget.page_bytes == half.pool.geometry.page_bytes(
        budget.tokens_per_page)
    for engine in (half, full):
        engine.generate(_greedy((5, 6, 7, 8), 4))
    assert half.kv_bytes() > 0 and 2 * half.kv_bytes() == full.kv_bytes()
    assert {r.dtype.name for r in half.runner.export_kv(0, 4)} == {"float16"}


@built
def test_without_the_kernels_the_kv_stays_float32(genai_model_dir, monkeypatch):
    monkeypatch.setenv(kernels.ENV, "0")
    engine = _load(genai_model_dir)
    assert {p.dtype for p in engine.spec.kv_pairs} == {"float32"}
    assert engine.kernel_use is not None and \
        engine.kernel_use.kv_reason == "turned off by ONNX_GENAI_KERNELS=0"


def _steps(engine: Engine, ids: list[int], n: int) -> list[np.ndarray]:
    runner = engine.runner
    runner.reset()
    out = [runner.forward(np.array(ids)).copy()]
    for i in range(n):
        out.append(runner.forward(np.array([(7 * i + 3) % 60 + 2])).copy())
    return out


def check_close_to_float32(small: Engine, full: Engine, drift: float, *,
                           differ: bool = True) -> None:
    """`small` (a smaller KV cache) against `full` (float32 KV): over a 200-token prompt and
    40 steps, logits within `drift` of the largest magnitude and the same argmax each step
    (and, with `differ`, not all the same: the small cache was kept), then the same 24
    greedy tokens after a 60-token prompt."""
    ids = [5 + (11 * i) % 53 for i in range(200)]
    pairs = list(zip(_steps(small, ids, 40), _steps(full, ids, 40), strict=True))
    for a, b in pairs:
        scale = max(float(np.abs(b).max()), 1.0)
        assert float(np.abs(a - b).max()) <= drift * scale
        assert int(a.argmax()) == int(b.argmax())
    if differ:
        assert any(not np.array_equal(a, b) for a, b in pairs)
    prompt = tuple(ids[:60])
    assert small.generate(_greedy(prompt, 24)).token_ids == \
        full.generate(_greedy(prompt, 24)).token_ids


@built
def test_float16_kv_answers_close_to_float32_kv(genai_model_dir):
    check_close_to_float32(_load(genai_model_dir), _load(genai_model_dir, kv_dtype="float32"),
                           F16_DRIFT)


ELEMENTS = pytest.mark.parametrize("element", ["float16", "int8", "int16"])


@built
@ELEMENTS
def test_float16_kv_gives_the_same_answer_on_every_path(genai_model_dir, element):
    """Chunks of 1 / 7 / 64, a repeat from the prefix cache, a batch of four and prompt
    lookup: the same tokens and log-probabilities, bit for bit."""
    engine = _load(genai_model_dir, max_batch=4, kv_dtype=element)
    assert engine.exact_paths and engine.spec.kv_pairs[0].dtype == element
    ids = [5 + (11 * i) % 53 for i in range(150)]
    last = {}
    for size in (1, 7, 64, len(ids)):
        engine.runner.reset()
        for start in range(0, len(ids), size):
            logits = engine.runner.forward(np.array(ids[start:start + size]))
        last[size] = logits.copy()
    for size in (1, 7, 64):
        np.testing.assert_array_equal(last[size], last[len(ids)], err_msg=str(size))
    request = _greedy(tuple(ids), 24, top_logprobs=2)
    first, again = engine.generate(request), engine.generate(request)
    assert again.prefix_cache_hit_len > 0
    assert again.token_ids == first.token_ids
    assert [(t.logprob, t.top) for t in again.logprobs] == \
        [(t.logprob, t.top) for t in first.logprobs]
    prompts = [tuple(ids[:20]), tuple(ids[30:63]), tuple(ids[70:117]), tuple(ids[:20]) * 3]
    solo = [engine.generate(_greedy(p, 16, top_logprobs=1)) for p in prompts]
    scheduler = Scheduler(engine)
    results: list[Any] = [None] * len(prompts)

    def sink(i: int) -> Callable[[Any], None]:
        return lambda item: results.__setitem__(i, item)

    for i, p in enumerate(prompts):
        scheduler.submit(_greedy(p, 16, top_logprobs=1), sink(i))
    while scheduler.step():
        pass
    assert scheduler.batched_steps > 0
    for alone, got in zip(solo, results, strict=True):
        assert got.result.token_ids == alone.token_ids
        assert [t.logprob for t in got.result.logprobs] == [t.logprob for t in alone.logprobs]
    repeated = tuple(ids[:25]) * 3
    plain = engine.generate(_greedy(repeated, 32, speculative_mode="none"))
    guessed = engine.generate(_greedy(repeated, 32, speculative_mode="prompt_lookup"))
    assert guessed.speculation is not None and guessed.speculation.accepted > 0
    assert guessed.token_ids == plain.token_ids


@built
@ELEMENTS
def test_sessions_and_forks_keep_float16_kv(genai_model_dir, element):
    """A session's next request and its fork's reuse the kept float16 KV and answer as a
    cold engine does for the whole history."""
    engine = _load(genai_model_dir, kv_dtype=element)
    sid = engine.create_session()
    history = (5, 9, 13, 17, 21) * 8
    answer = engine.generate_in_session(sid, _greedy(history, 8)).token_ids
    fork = engine.fork_session(sid)
    follow = (30, 31, 32)
    a = engine.generate_in_session(sid, _greedy(follow, 8))
    b = engine.generate_in_session(fork, _greedy(follow, 8))
    assert a.prefix_cache_hit_len > len(history) and b.prefix_cache_hit_len > len(history)
    cold = _load(genai_model_dir, prefix_cache=False, kv_dtype=element)
    whole = cold.generate(_greedy(history + tuple(answer) + follow, 8))
    assert a.token_ids == b.token_ids == whole.token_ids
    assert {r.dtype.name for r in engine.runner.export_kv(0, 8)} == {element}


def _stored(folder: Path, store: Path, **config: Any) -> tuple[Any, Any]:
    engine = _load(folder, kv_store=KVStoreConfig(chunk_tokens=16, disk_dir=str(store)),
                   **config)
    try:
        result = engine.generate(_greedy(tuple(range(9, 59)), 12))
        assert engine.kv_tiers is not None
        stats = engine.kv_tiers.store.stats()
        keys = engine.kv_tiers.available(list(range(9, 59)), 50)
        chunk = engine.kv_tiers.store.get(keys[0]) if keys else None
    finally:
        engine.close()
    return result, (stats, chunk)


@built
@ELEMENTS
def test_the_tiered_store_keeps_float16_chunks_and_never_mixes_in_float32_ones(
        genai_model_dir, tmp_path, element):
    store = tmp_path / "kv"
    old, _ = _stored(genai_model_dir, store, kv_dtype="float32")  # chunks of float32 KV
    first, (stats, chunk) = _stored(genai_model_dir, store, kv_dtype=element)
    assert first.prefix_cache_hit_len == 0 and stats["disk_hits"] == 0  # not float32's
    assert chunk is not None and {a.dtype.name for a in chunk} == {element}
    again, (stats, _) = _stored(genai_model_dir, store, kv_dtype=element)  # the disk only
    assert again.prefix_cache_hit_len == 48 and stats["disk_hits"] == 3
    assert again.token_ids == first.token_ids
    cold = _load(genai_model_dir, prefix_cache=False, kv_dtype=element)
    assert cold.generate(_greedy(tuple(range(9, 59)), 12)).token_ids == first.token_ids
    assert old.token_ids  # float32's answer, from its own chunks
