"""The LM head runs for the positions the engine uses only, and the logits stay the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest
from engine.model.graph_passes import LOGITS_TO_KEEP, keep_last_logits
from engine.model.io_spec import IOSpec
from tests.forge.reference_loop import reference_logits

FORGED = ["genai_model_dir", "int4_model_dir", "optimum_model_dir"]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(scale, 1.0))
    assert np.array_equal(got.argmax(-1), want.argmax(-1))


def _calls(engine: Engine, ids: list[int]) -> list[np.ndarray]:
    """A prefill, a verify of 8 tokens, a decode step; then all rows of a fresh prefill."""
    runner = engine.runner
    out = [runner.forward(np.array(ids[:15])).copy(),
           runner.forward(np.array(ids[15:]), all_logits=True).copy(),
           runner.forward(np.array([9])).copy()]
    runner.reset()
    return [*out, runner.forward(np.array(ids), all_logits=True).copy()]


@pytest.mark.parametrize("fixture", FORGED)
def test_the_engine_returns_each_positions_logits_as_the_unchanged_graph_does(fixture, request):
    model_dir: Path = request.getfixturevalue(fixture)
    # float32 KV: the file's own, as the plain session on it below keeps it
    pruned = Engine.load(model_dir, EngineConfig(intra_op_threads=1, kv_dtype="float32"))
    plain = Engine.load(model_dir, EngineConfig(intra_op_threads=1, prune_logits=False,
                                                kv_dtype="float32"))
    assert pruned.spec.logits_to_keep == LOGITS_TO_KEEP  # rewritten at load
    assert pruned.describe()["logits_to_keep"] == LOGITS_TO_KEEP
    assert plain.spec.logits_to_keep is None and plain.describe()["logits_to_keep"] is None
    ids = [5 + (7 * i) % 50 for i in range(23)]
    got, want = _calls(pruned, ids), _calls(plain, ids)
    assert [a.shape for a in got] == [b.shape for b in want]
    for a, b in zip(got, want, strict=True):
        _close(a, b)
    if fixture == "genai_model_dir":  # fp32: also a plain session on the file, no cache
        reference = reference_logits(model_dir, ids + [9])
        _close(got[0], reference[14])
        _close(got[1], reference[15:23])
        _close(got[2], reference[23])
        _close(got[3], reference[:23])


@pytest.mark.parametrize("fixture", FORGED)
def test_the_rewritten_graph_computes_only_the_rows_asked_for(fixture, request):
    model_dir: Path = request.getfixturevalue(fixture)
    # float32 KV: the spec feeds the file's own graph (no kernel, no 16-bit cache)
    engine = Engine.load(model_dir, EngineConfig(intra_op_threads=1, prune_logits=False,
                                                 kv_dtype="float32"))
    model_file = engine.model.model_file
    assert engine.spec.logits_to_keep is None
    rewritten = keep_last_logits(model_file.read_bytes(), engine.spec.logits)
    assert rewritten is not None
    assert model_file.read_bytes() != rewritten  # the file itself is left alone
    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(model_file.parent))
    session = ort.InferenceSession(rewritten, options, providers=["CPUExecutionProvider"])
    ids = [3, 17, 4, 29, 11, 8, 40]
    want = reference_logits(model_dir, ids)
    feeds = _feeds_like(session, engine.spec, ids)
    for keep in (1, 3, len(ids)):
        (logits,) = session.run(["logits"], {**feeds, LOGITS_TO_KEEP: np.array([keep])})
        assert logits.shape[:2] == (1, keep)
        _close(logits[0], want[-keep:])


def test_answers_and_logprobs_match_with_the_pass_turned_off(int4_model_dir):
    request = GenerateRequest(prompt="abc abc abc", options=GenerateOptions(
        max_new_tokens=12, greedy=True, top_logprobs=3, stop_on_eos=False))
    on = Engine.load(int4_model_dir, EngineConfig(intra_op_threads=1)).generate(request)
    off = Engine.load(int4_model_dir, EngineConfig(intra_op_threads=1, prune_logits=False)
                      ).generate(request)
    assert on.token_ids == off.token_ids and len(on.token_ids) == 12
    assert len(on.logprobs) == 12
    for a, b in zip(on.logprobs, off.logprobs, strict=True):
        assert a.token_id == b.token_id
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)


def test_a_last_position_only_graph_is_left_as_it_is(genai_pruned_model_dir):
    engine = Engine.load(genai_pruned_model_dir, EngineConfig(intra_op_threads=1))
    assert engine.spec.logits_last_only and engine.spec.logits_to_keep is None
    model = (genai_pruned_model_dir / "model.onnx").read_bytes()
    assert keep_last_logits(model, "logits") is None


# -- graphs the pass must leave alone: hand-made, the head after an embedding -------------

V, H = 12, 4


def _graph(*, after_head: str | None = None, head_output_too: bool = False,
           dynamic_weight: bool = False, taken_name: bool = False) -> bytes:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((V, H)).astype(np.float32), "emb"),
             numpy_helper.from_array(rng.standard_normal((H, V)).astype(np.float32), "w")]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["h"])]
    weight = "w"
    if dynamic_weight:
        inputs.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1]))
        nodes.append(helper.make_node("Mul", ["w", "scale"], ["w_scaled"]))
        weight = "w_scaled"
    if taken_name:
        inputs.append(helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.FLOAT, [1]))
        nodes.append(helper.make_node("Mul", ["h", LOGITS_TO_KEEP], ["h2"]))
    head_in = "h2" if taken_name else "h"
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq", V])]
    if after_head is None:
        nodes.append(helper.make_node("MatMul", [head_in, weight], ["logits"]))
    else:
        nodes.append(helper.make_node("MatMul", [head_in, weight], ["scores"]))
        attrs: dict[str, Any] = {"axis": -1} if after_head == "Softmax" else {}
        if after_head == "Cast":
            attrs = {"to": TensorProto.FLOAT}
        nodes.append(helper.make_node(after_head, ["scores"], ["logits"], **attrs))
        if head_output_too:
            outputs.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                                         [1, "seq", V]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def _feeds_like(session: ort.InferenceSession, spec: IOSpec, ids: list[int]
                ) -> dict[str, np.ndarray]:
    """Feeds for a prefill of `ids` from an empty past (the head size from the spec)."""
    n = len(ids)
    feeds = {spec.input_ids: np.array([ids], np.int64)}
    if spec.attention_mask:
        feeds[spec.attention_mask] = np.ones((1, n), np.int64)
    if spec.position_ids:
        feeds[spec.position_ids] = np.arange(n, dtype=np.int64)[None]
    for pair in spec.kv_pairs:
        feeds[pair.input] = np.zeros((1, pair.num_heads, 0, pair.head_dim), np.float32)
    return feeds


@pytest.mark.parametrize("after_head", [None, "Cast"])
def test_a_head_followed_by_row_wise_ops_is_sliced(after_head):
    plain = _graph(after_head=after_head)
    rewritten = keep_last_logits(plain, "logits")
    assert rewritten is not None
    onnx.checker.check_model(onnx.load_from_string(rewritten))
    ids = np.array([[1, 5, 2, 7]], np.int64)
    (want,) = ort.InferenceSession(plain).run(["logits"], {"input_ids": ids})
    (got,) = ort.InferenceSession(rewritten).run(
        ["logits"], {"input_ids": ids, LOGITS_TO_KEEP: np.array([2])})
    np.testing.assert_array_equal(got, want[:, -2:])


@pytest.mark.parametrize("case", [
    {"after_head": "Softmax"},  # not known to keep rows apart: left alone
    {"after_head": "Cast", "head_output_too": True},  # the head's own output is read too
    {"dynamic_weight": True},  # the "weights" depend on an input: not a head
    {"taken_name": True},  # the graph already has an input of that name
])
def test_graphs_the_pass_cannot_prove_safe_are_left_alone(case):
    assert keep_last_logits(_graph(**case), "logits") is None


def test_bytes_that_are_not_a_model_are_left_alone():
    assert keep_last_logits(b"\x00\x01 not an onnx file", "logits") is None
    assert keep_last_logits(_graph(), "no_such_output") is None


def _offset_head_graph(shape: list[int]) -> bytes:
    """A head with block offsets, as GGUF Q4_1 / K-quant imports have:
    `h @ w + block_sums(h) @ offsets`, the block sums a Reshape by `shape` and a ReduceSum."""
    rng = np.random.default_rng(1)
    blocks = 2
    inits = [numpy_helper.from_array(rng.standard_normal((V, H)).astype(np.float32), "emb"),
             numpy_helper.from_array(rng.standard_normal((H, V)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((blocks, V)).astype(np.float32),
                                     "offsets"),
             numpy_helper.from_array(np.array(shape, np.int64), "shape"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["y"]),
             helper.make_node("Reshape", ["h", "shape"], ["parts"]),
             helper.make_node("ReduceSum", ["parts", "axes"], ["sums"], keepdims=0),
             helper.make_node("MatMul", ["sums", "offsets"], ["extra"]),
             helper.make_node("Add", ["y", "extra"], ["logits"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq", V])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model.SerializeToString()


def test_a_head_with_block_offsets_is_sliced_once_for_both_of_its_readers():
    plain = _offset_head_graph([0, 0, 2, H // 2])
    rewritten = keep_last_logits(plain, "logits")
    assert rewritten is not None
    onnx.checker.check_model(onnx.load_from_string(rewritten))
    ids = np.array([[1, 5, 2, 7, 3]], np.int64)
    (want,) = ort.InferenceSession(plain).run(["logits"], {"input_ids": ids})
    (got,) = ort.InferenceSession(rewritten).run(
        ["logits"], {"input_ids": ids, LOGITS_TO_KEEP: np.array([3])})
    np.testing.assert_array_equal(got, want[:, -3:])


def test_block_sums_that_do_not_keep_the_rows_apart_are_left_alone():
    assert keep_last_logits(_offset_head_graph([1, -1, 2, H // 2]), "logits") is None
