"""tools/gguf_exact.py: a builder-style int4 graph gets the GGUF's own Q4_1 / Q8_0 blocks
back, and ONNX Runtime then computes with exactly the dequantized weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tools.gguf_exact import NotExact, make_exact, q4_1_blocks, q8_0_blocks

K, N, V = 64, 48, 40


def _q4_1(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """A weight as llama.cpp's Q4_1 dequantizes it: per block of 32, fp16 d and m."""
    d = rng.uniform(0.001, 0.05, (n, k // 32)).astype(np.float16).astype(np.float32)
    m = rng.uniform(-0.4, 0.0, (n, k // 32)).astype(np.float16).astype(np.float32)
    q = rng.integers(0, 16, (n, k // 32, 32))
    q[..., 0], q[..., 1] = 0, 15  # ggml's quantizer puts a block's min at 0, its max at 15
    return (d[..., None] * q + m[..., None]).reshape(n, k).astype(np.float32)


def _q8_0(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    d = rng.uniform(0.001, 0.05, (n, k // 32)).astype(np.float16).astype(np.float32)
    q = rng.integers(-127, 128, (n, k // 32, 32))
    q[..., 0] = 127
    return (d[..., None] * q).reshape(n, k).astype(np.float32)


def test_blocks_are_recovered_exactly_and_other_weights_are_refused() -> None:
    rng = np.random.default_rng(0)
    w = _q4_1(rng, N, K)
    b = q4_1_blocks(w, "w")
    assert b.minimum is not None
    rebuilt = (b.scales.astype(np.float32)[..., None] * b.codes
               + b.minimum.astype(np.float32)[..., None])
    assert np.array_equal(rebuilt.reshape(N, K), w)
    codes, d = q8_0_blocks(_q8_0(rng, V, K), "e")
    assert codes.dtype == np.uint8 and d.dtype == np.float16
    with pytest.raises(NotExact, match="not a dequantized Q4_1"):
        q4_1_blocks(rng.standard_normal((N, K)).astype(np.float32), "w")
    with pytest.raises(NotExact, match="not a dequantized Q8_0"):
        q8_0_blocks(rng.standard_normal((V, K)).astype(np.float32), "e")


def _builder_like_graph(folder: Path, rng: np.random.Generator) -> None:
    """What the onnxruntime-genai builder writes for one layer's down projection and a tied
    int4 embedding / LM head: symmetric int4 MatMulNBits (default zero point 8)."""
    inits = [
        numpy_helper.from_array(rng.integers(0, 256, (N, K // 32, 16)).astype(np.uint8),
                                "model.layers.0.mlp.down_proj.MatMul.weight_Q4"),
        numpy_helper.from_array(np.full((N, K // 32), 0.01, np.float32),
                                "model.layers.0.mlp.down_proj.MatMul.weight_scales"),
        numpy_helper.from_array(rng.integers(0, 256, (V, K // 32, 16)).astype(np.uint8),
                                "lm_head.MatMul.weight_Q4"),
        numpy_helper.from_array(np.full((V, K // 32), 0.01, np.float32),
                                "lm_head.MatMul.weight_scales"),
        numpy_helper.from_array(np.array([V, K // 2], np.int64), "embed_shape"),
    ]
    nodes = [
        helper.make_node("Reshape", ["lm_head.MatMul.weight_Q4", "embed_shape"], ["table"],
                         name="/model/embed_tokens/Reshape"),
        helper.make_node("GatherBlockQuantized", ["table", "ids", "lm_head.MatMul.weight_scales"],
                         ["embedded"], domain="com.microsoft", bits=4, block_size=32,
                         gather_axis=0, quantize_axis=1, name="/model/embed_tokens/Gather"),
        helper.make_node("MatMulNBits", ["x", "model.layers.0.mlp.down_proj.MatMul.weight_Q4",
                                         "model.layers.0.mlp.down_proj.MatMul.weight_scales"],
                         ["down"], domain="com.microsoft", K=K, N=N, bits=4, block_size=32,
                         accuracy_level=1, name="/model/layers.0/mlp/down_proj/MatMul"),
        helper.make_node("MatMulNBits", ["hidden", "lm_head.MatMul.weight_Q4",
                                         "lm_head.MatMul.weight_scales"],
                         ["logits"], domain="com.microsoft", K=K, N=V, bits=4, block_size=32,
                         accuracy_level=1, name="/lm_head/MatMul_Q4"),
    ]
    graph = helper.make_graph(
        nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", K]),
                         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "S", K]),
                         helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "S"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
         for n in ("down", "logits", "embedded")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True,
                    location="model.onnx.data")


@pytest.mark.parametrize("head8", [False, True], ids=["q4_1 layers", "and q8_0 head"])
def test_onnx_runtime_computes_with_the_gguf_weights(tmp_path: Path, head8: bool) -> None:
    rng = np.random.default_rng(1)
    _builder_like_graph(tmp_path, rng)
    down, embed = _q4_1(rng, N, K), _q8_0(rng, V, K)
    done = make_exact(tmp_path, {"model.layers.0.mlp.down_proj.weight": down,
                                 "model.embed_tokens.weight": embed}, head8=head8)
    assert done == {"q4_1_matmuls": 1, "q8_0_head": int(head8)}
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 3, K)).astype(np.float32)
    hidden = rng.standard_normal((1, 3, K)).astype(np.float32)
    ids = np.array([[0, 7, V - 1]], np.int64)
    got_down, got_logits, got_embedded = sess.run(
        ["down", "logits", "embedded"], {"x": x, "hidden": hidden, "ids": ids})
    np.testing.assert_allclose(got_down, x @ down.T, rtol=1e-5, atol=1e-5)
    if head8:  # the head is the Q8_0 embedding, used both ways
        np.testing.assert_allclose(got_logits, hidden @ embed.T, rtol=1e-5, atol=1e-5)
        assert np.array_equal(got_embedded[0], embed[ids[0]])
    else:  # the builder's int4 head is left as it was
        assert not np.allclose(got_logits, hidden @ embed.T, atol=1e-3)
