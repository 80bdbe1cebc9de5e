"""The engine runs GroupQueryAttention in its own kernel on the CPU, with the same results."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest, kernels
from engine.model.graph_passes import KERNEL_DOMAIN, own_attention
from engine.scheduling.scheduler import Scheduler
from tests.engine.equivalence import INT4_NOISE, NEAR_TIE

built = pytest.mark.skipif(kernels.library() is None,
                           reason="the engine's kernels were not built (no C compiler)")


def _domains(engine_or_bytes: bytes) -> list[str]:
    model = onnx.load_from_string(engine_or_bytes)
    return [n.domain for n in model.graph.node if n.op_type == "GroupQueryAttention"]


def test_the_pass_moves_every_float_gqa_node_and_leaves_the_file_alone(genai_model_dir):
    data = (genai_model_dir / "model.onnx").read_bytes()
    moved = own_attention(data)
    assert moved is not None
    assert set(_domains(moved)) == {KERNEL_DOMAIN} and len(_domains(moved)) == 2
    assert set(_domains(data)) == {"com.microsoft"}  # the bytes given are not changed
    model = onnx.load_from_string(moved)
    assert {(o.domain, o.version) for o in model.opset_import} >= {(KERNEL_DOMAIN, 1)}
    # the trailing empty inputs are dropped, the rest kept in place
    node = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    assert len(node.input) <= 9 and node.input[1] == "" and node.input[3].startswith("past")


def _gqa_graph(*, attrs: dict | None = None, kv_type: int = TensorProto.FLOAT,
               extra_input: bool = False, domain: str = "com.microsoft") -> bytes:
    names = ["q", "", "", "pk", "pv", "sl", "tl"] + ([""] * 4 + ["pos"] if extra_input else [])
    inputs = [helper.make_tensor_value_info("q", kv_type, [1, 1, 48]),
              helper.make_tensor_value_info("pk", kv_type, [1, 1, 8, 16]),
              helper.make_tensor_value_info("pv", kv_type, [1, 1, 8, 16]),
              helper.make_tensor_value_info("sl", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("tl", TensorProto.INT32, [])]
    if extra_input:
        inputs.append(helper.make_tensor_value_info("pos", TensorProto.INT64, [1, 1]))
    node = helper.make_node("GroupQueryAttention", names, ["o", "k", "v"], domain=domain,
                            num_heads=1, kv_num_heads=1, **(attrs or {}))
    outputs = [helper.make_tensor_value_info(n, kv_type, None) for n in ("o", "k", "v")]
    model = helper.make_model(helper.make_graph([node], "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def test_the_pass_moves_a_plain_node():
    moved = own_attention(_gqa_graph(attrs={"scale": 0.25, "do_rotary": 0}))
    assert moved is not None and _domains(moved) == [KERNEL_DOMAIN]


@pytest.mark.parametrize("graph", [
    pytest.param(lambda: _gqa_graph(attrs={"qk_output": 1}), id="an attribute it does not read"),
    pytest.param(lambda: _gqa_graph(kv_type=TensorProto.FLOAT16), id="an fp16 cache"),
    pytest.param(lambda: _gqa_graph(extra_input=True), id="position ids given"),
    pytest.param(lambda: _gqa_graph(domain="other.domain"), id="another domain's op"),
])
def test_nodes_the_kernel_does_not_handle_keep_onnx_runtimes(graph):
    assert own_attention(graph()) is None


def test_the_variable_turns_the_kernels_off(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "0")
    assert kernels.library() is None


def _steps(engine: Engine, ids: list[int], n: int) -> list[np.ndarray]:
    """A prefill, then `n` single-token decode steps: each step's logits."""
    runner = engine.runner
    runner.reset()
    out = [runner.forward(np.array(ids)).copy()]
    for i in range(n):
        out.append(runner.forward(np.array([(7 * i + 3) % 60 + 2])).copy())
    return out


@built
@pytest.mark.parametrize("fixture", ["genai_model_dir", "int4_model_dir"])
def test_decode_steps_give_the_logits_of_onnx_runtimes_kernel(fixture, request):
    folder: Path = request.getfixturevalue(fixture)
    # float32 KV on both sides (float16 KV: tests/engine/kernels/test_kv16.py)
    ours = Engine.load(folder, EngineConfig(intra_op_threads=2, kv_dtype="float32"))
    theirs = Engine.load(folder, EngineConfig(intra_op_threads=2, own_kernels=False))
    ids = [5 + (11 * i) % 53 for i in range(200)]  # the forged context is 256
    got, want = _steps(ours, ids, 40), _steps(theirs, ids, 40)
    for a, b in zip(got, want, strict=True):
        if fixture == "genai_model_dir":  # fp32: the same numbers up to rounding
            scale = max(float(np.abs(b).max()), 1.0)
            np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * scale)
            assert int(a.argmax()) == int(b.argmax())
            continue
        # int4: the next layer quantises its input to int8, so a last-bit difference in
        # the attention can move a log-probability by int4 noise (tests/engine/equivalence)
        la, lb = _log_softmax(a), _log_softmax(b)
        assert float(np.abs(la - lb).max()) <= INT4_NOISE
        top2 = np.sort(lb)[-2:]
        if top2[1] - top2[0] > NEAR_TIE:
            assert int(a.argmax()) == int(b.argmax())


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64).ravel()
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


@built
def test_concurrent_answers_are_the_same_with_and_without_the_kernel(genai_model_dir):
    prompts = [[5, 17, 42], list(range(30, 60)), list(range(60, 260))]

    def answers(own: bool) -> list[tuple[int, ...]]:
        engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=2, max_batch=4,
                                                           own_kernels=own, kv_dtype="float32"
                                                           if own else "auto"))
        scheduler = Scheduler(engine)
        results: list[Any] = [None] * len(prompts)

        def sink(i: int) -> Callable[[Any], None]:
            return lambda item: results.__setitem__(i, item)

        for i, ids in enumerate(prompts):
            request = GenerateRequest(token_ids=tuple(ids), options=GenerateOptions(
                max_new_tokens=16, temperature=0.0, stop_on_eos=False))
            scheduler.submit(request, sink(i))
        while scheduler.step():
            pass
        assert scheduler.batched_steps > 0  # the rows decoded together
        return [r.result.token_ids for r in results]

    assert answers(True) == answers(False)


def _last_logits(engine: Engine, ids: list[int], size: int) -> np.ndarray:
    """The prompt's last logits, its prefill run in calls of `size` tokens."""
    runner = engine.runner
    runner.reset()
    out = None
    for start in range(0, len(ids), size):
        out = runner.forward(np.array(ids[start:start + size])).copy()
    assert out is not None
    return out


@built
def test_prefill_in_chunks_of_any_size_gives_the_same_logits(genai_model_dir):
    """The attention of a prompt token has the same bits whether it runs in a prefill of
    the whole prompt, in chunks of 64 or 7, or as single-token steps (fp32 model: every
    other operator is per row too). ONNX Runtime's own kernel moves the last bits."""
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=2))
    ids = [5 + (11 * i) % 53 for i in range(200)]
    want = _last_logits(engine, ids, len(ids))
    for size in (1, 7, 64):
        np.testing.assert_array_equal(_last_logits(engine, ids, size), want)


@built
def test_a_repeated_request_gives_the_same_tokens_and_logprobs(genai_model_dir):
    """The repeat reuses the prompt's cached KV: its last prompt token runs as a one-token
    step instead of inside the prefill. Greedy tokens and their log-probabilities are the
    same, bit for bit."""
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=2))
    request = GenerateRequest(token_ids=tuple(5 + (7 * i) % 50 for i in range(150)),
                              options=GenerateOptions(max_new_tokens=24, temperature=0.0,
                                                      stop_on_eos=False, top_logprobs=2))
    first, again = engine.generate(request), engine.generate(request)
    assert first.prefix_cache_hit_len == 0 and again.prefix_cache_hit_len > 0
    assert again.token_ids == first.token_ids
    assert [(lp.logprob, lp.top) for lp in again.logprobs] == \
        [(lp.logprob, lp.top) for lp in first.logprobs]
