"""The engine's GroupQueryAttention kernel (engine/kernels) against ONNX Runtime's own.

Each case runs one GroupQueryAttention node in two real ONNX Runtime sessions: one with
the node in ONNX Runtime's domain, one moved to the engine's (the library registered), on
the same inputs, and compares the attention output and the caches. Decode steps (one new
token per row) and prefill chunks (several new tokens of one row), past and present sharing
one buffer, run the engine's code, and a token's output has the same bits whichever of them
computed it; the rest (caches that are not shared, say) must come back from ONNX Runtime's
kernel.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from engine import kernels
from engine.model.graph_passes import KERNEL_DOMAIN

pytestmark = pytest.mark.skipif(kernels.library() is None,
                                reason="the engine's kernels were not built (no C compiler)")


def _model(domain: str, heads: int, kv_heads: int, head: int, *, packed: bool, rotary: bool,
           interleaved: bool, scale: float, window: int = -1) -> bytes:
    width = (heads + 2 * kv_heads) * head if packed else heads * head
    names = ["query", "" if packed else "key", "" if packed else "value", "past_key",
             "past_value", "seqlens_k", "total_sequence_length"]
    cache: list[str | int] = ["b", kv_heads, "c", head]
    inputs = [helper.make_tensor_value_info("query", TensorProto.FLOAT, ["b", "s", width]),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, cache),
              helper.make_tensor_value_info("past_value", TensorProto.FLOAT, cache),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    if not packed:
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", kv_heads * head])
                   for n in ("key", "value")]
    if rotary:
        names += ["cos_cache", "sin_cache"]
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["p", head // 2])
                   for n in ("cos_cache", "sin_cache")]
    node = helper.make_node(
        "GroupQueryAttention", names, ["output", "present_key", "present_value"], domain=domain,
        num_heads=heads, kv_num_heads=kv_heads, scale=scale, do_rotary=int(rotary),
        rotary_interleaved=int(interleaved), local_window_size=window)
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["b", "s", heads * head])]
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", kv_heads, "t", head])
                for n in ("present_key", "present_value")]
    graph = helper.make_graph([node], "attention", inputs, outputs)
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


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray], *, shared: bool
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run with the caches bound as the engine binds them (past = present) or not."""
    binding = session.io_binding()
    binding.bind_output("output", "cpu")  # first: outputs come back in the order bound
    caches = {n: feeds[n].copy() for n in ("past_key", "past_value")}
    for name, value in feeds.items():
        if name not in caches:
            binding.bind_cpu_input(name, value)
    for name, cache in caches.items():
        binding.bind_input(name, "cpu", 0, np.float32, cache.shape, cache.ctypes.data)
        if shared:
            binding.bind_output(name.replace("past", "present"), "cpu", 0, np.float32,
                                cache.shape, cache.ctypes.data)
        else:
            binding.bind_output(name.replace("past", "present"), "cpu")
    session.run_with_iobinding(binding)
    out = binding.copy_outputs_to_cpu()
    if shared:
        return out[0], caches["past_key"], caches["past_value"]
    return out[0], out[1], out[2]


def _feeds(rng: np.random.Generator, heads: int, kv_heads: int, head: int, lengths: list[int],
           new: int, capacity: int, *, packed: bool, rotary: bool) -> dict[str, np.ndarray]:
    rows = len(lengths)
    width = (heads + 2 * kv_heads) * head if packed else heads * head
    feeds = {
        "query": rng.standard_normal((rows, new, width), dtype=np.float32),
        "past_key": np.zeros((rows, kv_heads, capacity, head), np.float32),
        "past_value": np.zeros((rows, kv_heads, capacity, head), np.float32),
        # GroupQueryAttention's convention: each row's total length (past + new) - 1
        "seqlens_k": np.array([n + new - 1 for n in lengths], np.int32),
        "total_sequence_length": np.array(max(lengths) + new, np.int32),
    }
    for r, n in enumerate(lengths):  # each row's cache: its own length, zeros after it
        feeds["past_key"][r, :, :n] = rng.standard_normal((kv_heads, n, head)) * 2
        feeds["past_value"][r, :, :n] = rng.standard_normal((kv_heads, n, head))
    if not packed:
        feeds["key"] = rng.standard_normal((rows, new, kv_heads * head), dtype=np.float32)
        feeds["value"] = rng.standard_normal((rows, new, kv_heads * head), dtype=np.float32)
    if rotary:
        angles = np.arange(capacity)[:, None] * 10000.0 ** (-np.arange(head // 2) / (head // 2))
        feeds["cos_cache"] = np.cos(angles).astype(np.float32)
        feeds["sin_cache"] = np.sin(angles).astype(np.float32)
    return feeds


def _compare(case: dict, lengths: list[int], new: int, *, shared: bool = True,
             capacity: int = 1100, window: int = -1) -> None:
    heads, kv_heads, head = case["heads"], case["kv_heads"], case["head"]
    args = dict(packed=case["packed"], rotary=case["rotary"])
    feeds = _feeds(np.random.default_rng(len(lengths) + new), heads, kv_heads, head, lengths,
                   new, capacity, **args)
    shape = dict(heads=heads, kv_heads=kv_heads, head=head, interleaved=case["interleaved"],
                 scale=case["scale"], window=window, **args)
    ours = _run(_session(_model(KERNEL_DOMAIN, **shape)), feeds, shared=shared)
    theirs = _run(_session(_model("com.microsoft", **shape)), feeds, shared=shared)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=0, atol=2e-5)
    for r, n in enumerate(lengths):  # the caches: every position a row holds
        for mine, want in zip(ours[1:], theirs[1:], strict=True):
            np.testing.assert_allclose(mine[r, :, :n + new], want[r, :, :n + new],
                                       rtol=0, atol=1e-5)


CASES = {
    "smollm2 (9 heads over 3, 64, packed, rotary)":
        dict(heads=9, kv_heads=3, head=64, packed=True, rotary=True, interleaved=False,
             scale=0.125),
    "multi-head (4 over 4, 24, separate k and v, no rotary)":
        dict(heads=4, kv_heads=4, head=24, packed=False, rotary=False, interleaved=False,
             scale=0.0),
    "8 over 2, 128, interleaved rotary":
        dict(heads=8, kv_heads=2, head=128, packed=True, rotary=True, interleaved=True,
             scale=0.0),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_decode_step_matches_onnx_runtime_for_rows_of_different_lengths(case):
    # one row empty, one within a chunk, two across chunks of 512 positions
    _compare(case, [0, 37, 700, 1023], new=1)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_prefill_chunk_matches_onnx_runtime(case):
    _compare(case, [300], new=5)  # few rows: the positions are split among the threads
    _compare(case, [0], new=9)
    _compare(case, [700], new=70)  # many rows: a task per row and KV head


def _pieces(case: dict, sizes: list[int], past: int = 0, threads: int = 2, window: int = -1
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row's prompt of sum(sizes) new tokens after `past` cached ones, run through the
    engine's kernel in calls of `sizes` tokens each (the cache carried between calls, as
    the engine's prefill chunks and decode steps do): the outputs of every token, and
    the caches."""
    heads, kv_heads, head = case["heads"], case["kv_heads"], case["head"]
    args = dict(packed=case["packed"], rotary=case["rotary"])
    total = sum(sizes)
    whole = _feeds(np.random.default_rng(7), heads, kv_heads, head, [past], total, 1100,
                   **args)
    session = _session(_model(KERNEL_DOMAIN, heads=heads, kv_heads=kv_heads, head=head,
                              interleaved=case["interleaved"], scale=case["scale"],
                              window=window, **args),
                       threads)
    caches = {n: whole[n] for n in ("past_key", "past_value")}
    outputs, done = [], 0
    for size in sizes:
        feeds = {name: value[:, done:done + size] for name, value in whole.items()
                 if name in ("query", "key", "value")}
        feeds.update(caches, seqlens_k=np.array([past + done + size - 1], np.int32),
                     total_sequence_length=np.array(past + done + size, np.int32))
        if case["rotary"]:
            feeds.update(cos_cache=whole["cos_cache"], sin_cache=whole["sin_cache"])
        out, key, value = _run(session, feeds, shared=True)
        caches = {"past_key": key, "past_value": value}
        outputs.append(out)
        done += size
    return np.concatenate(outputs, axis=1), caches["past_key"], caches["past_value"]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_token_gets_the_same_bits_alone_or_among_others(case):
    """What makes the same request give the same answer whatever path it takes: a prompt
    run whole, in chunks of 7 and 64, one token at a time (decode steps), or on one
    thread, gives every token's output and the caches bit for bit the same."""
    want = _pieces(case, [300], past=290)
    for sizes, threads in (([7] * 42 + [6], 2), ([64] * 4 + [44], 2), ([1] * 300, 2),
                           ([300], 1)):
        got = _pieces(case, sizes, past=290, threads=threads)
        for mine, theirs in zip(got, want, strict=True):
            np.testing.assert_array_equal(mine, theirs)


def test_caches_that_are_not_shared_are_left_to_onnx_runtimes_kernel():
    case = CASES["smollm2 (9 heads over 3, 64, packed, rotary)"]
    _compare(case, [40, 513], new=1, shared=False, capacity=600)


def test_large_scores_do_not_overflow_the_softmax():
    """Scores of several hundred (a large scale on big keys): each chunk's maximum is
    taken out before the exponent, as in ONNX Runtime's softmax."""
    case = dict(CASES["smollm2 (9 heads over 3, 64, packed, rotary)"], scale=8.0)
    _compare(case, [600], new=1)


@pytest.mark.parametrize("paths", ["portable", "avx2", "avx512"])
def test_the_other_paths_match_too(tmp_path, paths):
    """Where the CPU lacks AVX-512 the dot products run in AVX2, where it lacks AVX2 and
    FMA in plain C loops: the cases again, in a process told to take them (the choice is
    made once per process)."""
    if os.environ.get(kernels.ENV) in ("portable", "avx2", "avx512"):
        pytest.skip("this process is one of those runs")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
         str(tmp_path / "run"),
         f"{__file__}::test_a_decode_step_matches_onnx_runtime_for_rows_of_different_lengths",
         f"{__file__}::test_a_prefill_chunk_matches_onnx_runtime",
         f"{__file__}::test_a_token_gets_the_same_bits_alone_or_among_others"],
        env={**os.environ, kernels.ENV: paths}, capture_output=True, text=True,
        timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "9 passed" in done.stdout


def _fallbacks() -> int:
    """Runs the kernels' library has handed to ONNX Runtime's kernel so far (this process)."""
    import ctypes

    lib = ctypes.CDLL(str(kernels.library()))
    lib.EngineKernelsFallbacks.restype = ctypes.c_long
    return int(lib.EngineKernelsFallbacks())


@pytest.mark.parametrize("window", [1, 100, 256, 300])
def test_a_sliding_window_matches_onnx_runtime_in_the_engines_own_code(window):
    """local_window_size (Gemma, Mistral and GGUF imports that declare a sliding window): a
    row attends its last `window` positions, itself included, as ONNX Runtime's kernel does
    (measured: not window + 1); decode steps
    of rows shorter and longer than the window, across chunk boundaries, and prefill chunks
    far into a cache, all in the engine's code (none handed to ONNX Runtime)."""
    case = CASES["smollm2 (9 heads over 3, 64, packed, rotary)"]
    before = _fallbacks()
    _compare(case, [1, 50, 257, 700, 1000], 1, window=window)       # decode steps
    _compare(case, [600], 300, window=window)                        # a prefill chunk
    _compare(case, [0], 200, window=window)                          # a first prompt
    assert _fallbacks() == before


def test_a_token_gets_the_same_bits_alone_or_among_others_in_a_sliding_window():
    """A window of 100 over a past of 290: the prompt whole, in chunks of 7, one token at
    a time, on one thread: every output bit for bit the same."""
    case = CASES["smollm2 (9 heads over 3, 64, packed, rotary)"]
    want = _pieces(case, [300], past=290, window=100)
    for sizes, threads in (([7] * 42 + [6], 2), ([1] * 300, 2), ([300], 1)):
        got = _pieces(case, sizes, past=290, threads=threads, window=100)
        for mine, theirs in zip(got, want, strict=True):
            np.testing.assert_array_equal(mine, theirs)
