"""The engine's MatMulNBits: ONNX Runtime's results within int4 rounding, and each row the
same bits whatever the number of rows in the call or of threads."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine import Engine, EngineConfig, kernels
from engine.model.default_model import default_model_dir
from engine.model.graph_passes import KERNEL_DOMAIN
from engine.model.matmul_pass import EIGHT_BIT, own_matmul_moves

pytestmark = pytest.mark.skipif(kernels.library() is None,
                                reason="the engine's kernels were not built (no C compiler)")

#: bits, block, zero points, accuracy level, K, N, bias: the builder's int4 (block 32 and
#: 128, with and without zero points, accuracy 4 and 0), the GGUF importer's Q4_0 / Q8_0
#: (blocks of 32, no zero points) and Q6_K (8-bit blocks of 16), and odd tails.
LAYOUTS = {
    "int4 b32 acc4 (built-in model)": (4, 32, False, 4, 576, 960, False),
    "int4 b32 zp acc4 odd": (4, 32, True, 4, 70, 33, False),
    "int4 b128 zp acc0": (4, 128, True, 0, 300, 50, False),
    "int4 b128 acc0": (4, 128, False, 0, 256, 17, False),
    "int4 b128 acc4": (4, 128, False, 4, 384, 40, False),
    "int4 b16 zp acc4 bias": (4, 16, True, 4, 48, 20, True),
    "int4 b64 acc0 bias odd": (4, 64, False, 0, 100, 31, True),
    "int8 b32 acc4 (Q8_0)": (8, 32, False, 4, 96, 40, False),
    "int8 b16 acc4 (Q6_K)": (8, 16, False, 4, 64, 24, False),
    "int8 b32 zp acc0": (8, 32, True, 0, 64, 19, False),
}


def _weights(rng: np.random.Generator, bits: int, block: int, with_zp: bool, k: int, n: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Random codes in MatMulNBits' layout: B [N, blocks, block * bits / 8], scales
    [N * blocks], zero points (packed two a byte for 4 bits) or None."""
    blocks = -(-k // block)
    top = (1 << bits) - 1
    codes = rng.integers(0, top + 1, size=(n, blocks, block), dtype=np.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4) if bits == 4 else codes
    scales = (rng.random((n, blocks), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
    zp = None
    if with_zp:
        z = rng.integers(0, top + 1, size=(n, blocks), dtype=np.uint8)
        if bits == 4:
            even = np.concatenate([z, np.zeros((n, blocks % 2), np.uint8)], axis=1)
            z = (even[:, 0::2] | (even[:, 1::2] << 4)).astype(np.uint8)
        zp = z.reshape(-1)
    return packed.astype(np.uint8), scales.reshape(-1), zp


def _model(domain: str, layout: tuple, seed: int = 0) -> bytes:
    bits, block, with_zp, accuracy, k, n, with_bias = layout
    rng = np.random.default_rng(seed)
    b, scales, zp = _weights(rng, bits, block, with_zp, k, n)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
    names = ["A", "B", "scales"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zp"))
    names.append("zp" if zp is not None else "")
    if with_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        names += ["", "bias"]
    while not names[-1]:
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], domain=domain, K=k, N=n, bits=bits,
                            block_size=block, accuracy_level=accuracy)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "rows", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "rows", n])], inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(KERNEL_DOMAIN, 1)])
    model.ir_version = 9
    return model.SerializeToString()


def _session(model: bytes, threads: int = 2) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(str(kernels.library()))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _rows(k: int, m: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    a[0, :, :3] *= 20  # an outlier or two per row, as in a model's hidden states
    return a


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_engine_op_agrees_with_onnx_runtimes(name):
    layout = LAYOUTS[name]
    k = layout[4]
    a = _rows(k, 9)
    ours = _session(_model(KERNEL_DOMAIN, layout)).run(None, {"A": a})[0]
    theirs = _session(_model("com.microsoft", layout)).run(None, {"A": a})[0]
    assert ours.shape == theirs.shape == (1, 9, layout[5])
    # the two kernels round each block of a row to int8 the same way (accuracy 4) and
    # differ only in the order the products add up: a few float roundings apart
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-6 * np.abs(theirs).max())


def _invariance(domain: str, layout: tuple) -> list[str]:
    """Where rows computed in calls of other sizes, or on other thread counts, differ from
    the same rows computed one at a time (an empty list: nowhere)."""
    k = layout[4]
    a = _rows(k, 64)
    model = _model(domain, layout)
    two, one = _session(model, 2), _session(model, 1)
    alone = np.concatenate([two.run(None, {"A": a[:, i:i + 1]})[0] for i in range(64)], axis=1)
    found = []
    for m in (2, 7, 64):
        together = np.concatenate([two.run(None, {"A": a[:, i:i + m]})[0]
                                   for i in range(0, 64, m)], axis=1)
        if not np.array_equal(together, alone):
            found.append(f"{m} rows a call")
    if not np.array_equal(one.run(None, {"A": a})[0], two.run(None, {"A": a})[0]):
        found.append("1 thread against 2")
    return found


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_row_is_the_same_bits_alone_or_among_others_and_on_any_thread_count(name):
    assert _invariance(KERNEL_DOMAIN, LAYOUTS[name]) == []


def test_onnx_runtimes_own_op_is_not_row_invariant():
    """Why the engine has its own: ONNX Runtime's kernel gives a row other bits in a call
    of several rows than alone (here blocks of 128; ONNX Runtime 1.32 happens to keep blocks of
    32 the same)."""
    assert _invariance("com.microsoft", LAYOUTS["int4 b128 acc4"]) != []


def test_the_avx2_code_and_the_portable_loops_give_the_same_bits(tmp_path):
    """Without AVX-512 VNNI the AVX2 code (4-bit, accuracy 4) or the plain C loops run: the
    same outputs, bit for bit, as AVX-512 (the choice is made once per process, so each
    runs in a child; on a CPU without AVX2 or AVX-512 they fall back to the plain C loops)."""
    if os.environ.get(kernels.ENV) in ("portable", "avx2"):
        pytest.skip("this process is a child run")
    outputs = {}
    for choice in ("1", "avx2", "portable"):
        out = tmp_path / f"{choice}.npz"
        code = ("import sys, numpy as np; sys.path.insert(0, sys.argv[2]); "
                "from tests.engine.kernels import test_matmul_nbits as t; "
                "np.savez(sys.argv[1], **{str(i): t._session(t._model(t.KERNEL_DOMAIN, l))"
                ".run(None, {'A': t._rows(l[4], 7)})[0] "
                "for i, l in enumerate(t.LAYOUTS.values())})")
        done = subprocess.run([sys.executable, "-c", code, str(out), os.getcwd()],
                              env={**os.environ, kernels.ENV: choice}, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        with np.load(out) as data:
            outputs[choice] = {key: data[key] for key in data.files}
    for key, vector in outputs["1"].items():
        np.testing.assert_array_equal(vector, outputs["avx2"][key])
        np.testing.assert_array_equal(vector, outputs["portable"][key])


def _ops(data: bytes) -> list[tuple[str, str]]:
    return [(n.op_type, n.domain) for n in onnx.load_from_string(data).graph.node]


def test_the_pass_moves_the_nodes_the_kernel_covers_and_says_why_not_the_others():
    covered = onnx.load_from_string(_model("com.microsoft", LAYOUTS["int4 b32 zp acc4 odd"]))
    graph = covered.graph
    graph.node[0].output[0] = "y0"
    extra = [
        # act-order weights (g_idx), 2-bit weights, 8-bit weights, fp16 scales
        helper.make_node("MatMulNBits", ["A", "B", "scales", "", "g"], ["y1"],
                         domain="com.microsoft", K=70, N=33, bits=4, block_size=32),
        helper.make_node("MatMulNBits", ["A", "B", "scales"], ["y2"], domain="com.microsoft",
                         K=70, N=33, bits=2, block_size=32),
        helper.make_node("MatMulNBits", ["A", "B", "scales"], ["y3"], domain="com.microsoft",
                         K=70, N=33, bits=8, block_size=32),
        helper.make_node("MatMulNBits", ["A", "B", "half"], ["y4"], domain="com.microsoft",
                         K=70, N=33, bits=4, block_size=32),
        helper.make_node("Sum", ["y0", "y1", "y2", "y3", "y4"], ["Y"]),
    ]
    graph.node.extend(extra)
    graph.initializer.extend([
        numpy_helper.from_array(np.zeros(70, np.int32), "g"),
        numpy_helper.from_array(np.ones(33 * 3, np.float16), "half")])
    moved, nodes, kept = own_matmul_moves(covered.SerializeToString())
    assert moved is not None and nodes == 5
    assert kept == {"g_idx (act-order weights)": 1, "2-bit weights": 1, EIGHT_BIT: 1,
                    "fp16 activations and scales": 1}
    assert _ops(moved)[0] == ("MatMulNBits", KERNEL_DOMAIN)
    assert [d for _, d in _ops(moved)[1:5]] == ["com.microsoft"] * 4
    # asked to, the 8-bit node moves too; the engine's domain is imported once
    moved, _, kept = own_matmul_moves(moved, eight_bit=True)
    assert moved is not None and EIGHT_BIT not in kept
    assert _ops(moved)[3] == ("MatMulNBits", KERNEL_DOMAIN)
    domains = [o.domain for o in onnx.load_from_string(moved).opset_import]
    assert domains.count(KERNEL_DOMAIN) == 1


def test_the_built_in_models_nodes_all_run_the_engine_kernel_and_the_switch_turns_it_off(
        monkeypatch):
    model = default_model_dir()
    if model is None:
        pytest.skip("no built-in model in this checkout")
    engine = Engine.load(model, EngineConfig(intra_op_threads=1))
    try:
        use = engine.kernel_use
        assert use is not None
        assert (use.matmul_nodes, use.matmul_moved) == (151, 151)
        assert "151 of 151 MatMulNBits nodes run the engine kernel" in use.line()
        assert use.as_dict()["matmul_moved"] == 151
    finally:
        engine.close()
    monkeypatch.setenv(kernels.MATMUL_ENV, "0")
    engine = Engine.load(model, EngineConfig(intra_op_threads=1))
    try:
        use = engine.kernel_use
        assert use is not None and use.matmul_moved == 0 and use.moved == use.nodes
        assert f"turned off by {kernels.MATMUL_ENV}=0" in use.line()
    finally:
        engine.close()


def _offset_corrected(k: int = 96, n: int = 40, block: int = 32) -> bytes:
    """The GGUF importer's int4 blocks with a minimum: `Add(MatMulNBits(A), MatMul(block
    sums of A, offsets))` (engine.model.gguf_graph)."""
    model = onnx.load_from_string(_model("com.microsoft", (4, block, False, 4, k, n, False)))
    graph = model.graph
    graph.node[0].output[0] = "y"
    offsets = np.random.default_rng(5).standard_normal((k // block, n)).astype(np.float32)
    graph.initializer.extend([
        numpy_helper.from_array(offsets, "offsets"),
        numpy_helper.from_array(np.array([0, 0, k // block, block], np.int64), "shape"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    graph.node.extend([helper.make_node("Reshape", ["A", "shape"], ["parts"]),
                       helper.make_node("ReduceSum", ["parts", "axes"], ["sums"], keepdims=0),
                       helper.make_node("MatMul", ["sums", "offsets"], ["extra"]),
                       helper.make_node("Add", ["y", "extra"], ["Y"])])
    return model.SerializeToString()


def test_an_offset_corrected_matmul_becomes_one_node_with_the_same_results():
    data = _offset_corrected()
    moved, nodes, kept = own_matmul_moves(data)
    assert moved is not None and nodes == 1 and not kept
    assert _ops(moved) == [("MatMulNBits", KERNEL_DOMAIN)]  # the block sums, MatMul, Add: gone
    a = _rows(96, 64)
    ours = _session(moved).run(None, {"A": a})[0]
    theirs = _session(data).run(None, {"A": a})[0]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-6 * np.abs(theirs).max())
    session = _session(moved)
    alone = np.concatenate([session.run(None, {"A": a[:, i:i + 1]})[0] for i in range(64)], 1)
    np.testing.assert_array_equal(session.run(None, {"A": a})[0], alone)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _allocated_bytes() -> int | None:
    """The bytes this process holds from malloc (glibc's mallinfo2), None elsewhere."""
    try:
        call = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    call.restype = _MallInfo2
    info = call()
    return int(info.uordblks + info.hblkhd)


def test_the_weights_are_repacked_while_the_session_loads_not_in_its_first_run():
    """The kernel's copy of constant weights is made when ONNX Runtime creates the kernel:
    a first request does not wait for it, and it is in memory before the engine moves the
    model's memory onto huge pages (engine/runtime/hugepages.py)."""
    if _allocated_bytes() is None:
        pytest.skip("needs glibc's mallinfo2 to count allocated bytes")
    k, n = 1024, 16384
    copy = n * k // 2 + n * (k // 32) * 4  # 10 MiB of codes and scales
    session = _session(_model(KERNEL_DOMAIN, (4, 32, False, 4, k, n, False)))
    a = _rows(k, 1)
    before = _allocated_bytes()
    session.run(None, {"A": a})
    after = _allocated_bytes()
    assert before is not None and after is not None
    assert after - before < copy / 4  # (ONNX Runtime's own first-run buffers: ~1 MiB)


def test_weights_given_at_run_time_are_repacked_by_the_first_run():
    """Where the weights are not constants of the graph the first run makes the copy: the
    same bits as with constant weights."""
    layout = LAYOUTS["int4 b32 zp acc4 odd"]
    constant = onnx.load_from_string(_model(KERNEL_DOMAIN, layout))
    given = {t.name: numpy_helper.to_array(t) for t in constant.graph.initializer}
    fed = onnx.load_from_string(_model(KERNEL_DOMAIN, layout))
    del fed.graph.initializer[:]
    fed.graph.input.extend([
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype),
                                      list(v.shape)) for name, v in given.items()])
    a = _rows(layout[4], 5)
    ours = _session(fed.SerializeToString()).run(None, {"A": a, **given})[0]
    theirs = _session(constant.SerializeToString()).run(None, {"A": a})[0]
    np.testing.assert_array_equal(ours, theirs)
