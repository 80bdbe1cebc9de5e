"""The engine's GroupQueryAttention over a float16 KV cache (engine.kernels::
GroupQueryAttentionF16KV, engine/kernels/decode_attention.c).

Each case runs one node in a real ONNX Runtime session with the library registered, the
float16 caches bound as the engine binds them (past and present one buffer). The
operator's promise: each new key (after rotary) and value is rounded to float16 (to
nearest, ties to even) and written to the cache first, and the attention reads the cache's
float16 values as float32. So the cache must hold exactly numpy's float16 of the new keys
and values, the output must match attention computed in float64 over that cache, and a
token's output must have the same bits alone, in chunks of any size, on one or two threads.
Shapes the kernel's own code does not cover (several rows of several tokens, a present
that is not the past's buffer) go to ONNX Runtime's fp32 kernel on float32 copies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from engine import kernels
from engine.model.graph_passes import KERNEL_DOMAIN
from engine.model.kv16_pass import I8_SCALE_BYTES, I16_SCALE_ELEMS

pytestmark = pytest.mark.skipif(kernels.library() is None,
                                reason="the engine's kernels were not built (no C compiler)")

OP = "GroupQueryAttentionF16KV"
CAPACITY = 1100

CASES = {
    "smollm2 (9 heads over 3, 64, packed, rotary)":
        dict(heads=9, kv_heads=3, head=64, packed=True, rotary=True, interleaved=False,
             scale=0.125),
    "multi-head (4 over 4, 24, separate k and v, no rotary)":
        dict(heads=4, kv_heads=4, head=24, packed=False, rotary=False, interleaved=False,
             scale=0.0),
    "8 over 2, 128, separate k and v, interleaved rotary":
        dict(heads=8, kv_heads=2, head=128, packed=False, rotary=True, interleaved=True,
             scale=0.0),
}


#: The cache's element: (operator, ONNX element type, extra bytes a row, numpy dtype).
ELEMENTS = {"float16": (OP, TensorProto.FLOAT16, 0, np.float16),
            "int8": ("GroupQueryAttentionI8KV", TensorProto.INT8, I8_SCALE_BYTES, np.int8),
            "int16": ("GroupQueryAttentionI16KV", TensorProto.INT16, I16_SCALE_ELEMS, np.int16)}


def _model(case: dict, element: str = "float16") -> bytes:
    op, elem, extra, _ = ELEMENTS[element]
    heads, kv_heads, head = case["heads"], case["kv_heads"], case["head"]
    packed, rotary = case["packed"], case["rotary"]
    width = (heads + 2 * kv_heads) * head if packed else heads * head
    names = ["query", "" if packed else "key", "" if packed else "value", "past_key",
             "past_value", "seqlens_k", "total_sequence_length"]
    cache: list[str | int] = ["b", kv_heads, "c", head + extra]
    inputs = [helper.make_tensor_value_info("query", TensorProto.FLOAT, ["b", "s", width]),
              helper.make_tensor_value_info("past_key", elem, cache),
              helper.make_tensor_value_info("past_value", elem, cache),
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
        op, names, ["output", "present_key", "present_value"], domain=KERNEL_DOMAIN,
        num_heads=heads, kv_num_heads=kv_heads, scale=case["scale"], do_rotary=int(rotary),
        rotary_interleaved=int(case["interleaved"]), local_window_size=case.get("window", -1))
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["b", "s", heads * head])]
    outputs += [helper.make_tensor_value_info(n, elem, ["b", kv_heads, "t", head + extra])
                for n in ("present_key", "present_value")]
    model = helper.make_model(
        helper.make_graph([node], "attention", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
                       helper.make_opsetid(KERNEL_DOMAIN, 1)])
    model.ir_version = 9
    return model.SerializeToString()


def _session(case: dict, threads: int = 2, element: str = "float16") -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(str(kernels.library()))
    return ort.InferenceSession(_model(case, element), options,
                                providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray], *, shared: bool = True
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The output and the two caches after the run (past = present when `shared`)."""
    binding = session.io_binding()
    binding.bind_output("output", "cpu")  # first: outputs come back in the order bound
    caches = {n: feeds[n].copy() for n in ("past_key", "past_value")}
    for name, value in feeds.items():
        if name not in caches:
            binding.bind_cpu_input(name, value)
    for name, cache in caches.items():
        binding.bind_input(name, "cpu", 0, cache.dtype, cache.shape, cache.ctypes.data)
        if shared:
            binding.bind_output(name.replace("past", "present"), "cpu", 0, cache.dtype,
                                cache.shape, cache.ctypes.data)
        else:
            binding.bind_output(name.replace("past", "present"), "cpu")
    session.run_with_iobinding(binding)
    out = binding.copy_outputs_to_cpu()
    if shared:
        return out[0], caches["past_key"], caches["past_value"]
    return out[0], out[1], out[2]


def _feeds(rng: np.random.Generator, case: dict, lengths: list[int], new: int,
           capacity: int = CAPACITY) -> dict[str, np.ndarray]:
    heads, kv_heads, head = case["heads"], case["kv_heads"], case["head"]
    rows = len(lengths)
    width = (heads + 2 * kv_heads) * head if case["packed"] else heads * head
    feeds = {
        "query": rng.standard_normal((rows, new, width), dtype=np.float32),
        "past_key": np.zeros((rows, kv_heads, capacity, head), np.float16),
        "past_value": np.zeros((rows, kv_heads, capacity, head), np.float16),
        # GroupQueryAttention's convention: each row's total length (past + new) - 1
        "seqlens_k": np.array([n + new - 1 for n in lengths], np.int32),
        "total_sequence_length": np.array(max(lengths) + new, np.int32),
    }
    for r, n in enumerate(lengths):  # each row's cache: its own length, zeros after it
        feeds["past_key"][r, :, :n] = rng.standard_normal((kv_heads, n, head)) * 2
        feeds["past_value"][r, :, :n] = rng.standard_normal((kv_heads, n, head))
    if not case["packed"]:
        feeds["key"] = rng.standard_normal((rows, new, kv_heads * head), dtype=np.float32)
        feeds["value"] = rng.standard_normal((rows, new, kv_heads * head), dtype=np.float32)
    if case["rotary"]:
        angles = np.arange(capacity)[:, None] * 10000.0 ** (-np.arange(head // 2) / (head // 2))
        feeds["cos_cache"] = np.cos(angles).astype(np.float32)
        feeds["sin_cache"] = np.sin(angles).astype(np.float32)
    return feeds


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotary embedding of x [..., head] with cos, sin [..., head / 2] broadcast, in x's
    precision (float32: the kernel's arithmetic, product by product)."""
    half = cos.shape[-1]
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
    else:
        x1, x2 = x[..., :half], x[..., half:2 * half]
    a, b = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = x.copy()
    if interleaved:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = a, b
    else:
        out[..., :half], out[..., half:2 * half] = a, b
    return out


def _new_kv(case: dict, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, list]:
    """The new keys (rotated, float32) and values [rows, new, kv_heads, head], and each
    row's positions."""
    heads, kv_heads, head = case["heads"], case["kv_heads"], case["head"]
    rows, new = feeds["query"].shape[:2]
    if case["packed"]:
        qkv = feeds["query"]
        key = qkv[..., heads * head:(heads + kv_heads) * head]
        value = qkv[..., (heads + kv_heads) * head:]
    else:
        key, value = feeds["key"], feeds["value"]
    key = key.reshape(rows, new, kv_heads, head).copy()
    value = value.reshape(rows, new, kv_heads, head)
    positions = [np.arange(int(s) + 1 - new, int(s) + 1) for s in feeds["seqlens_k"]]
    if case["rotary"]:
        for r in range(rows):
            cos = feeds["cos_cache"][positions[r]][:, None, :]
            sin = feeds["sin_cache"][positions[r]][:, None, :]
            key[r] = _rotate(key[r], cos, sin, case["interleaved"])
    return key, value, positions


def _reference(case: dict, feeds: dict[str, np.ndarray], *, round_new: bool = True
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The output (in float64) and the float16 caches the operator promises: the new keys
    and values rounded into the cache first (`round_new`; else the attention reads them
    unrounded, as ONNX Runtime's fp32 kernel does on the fallback's float32 copies)."""
    rows = feeds["query"].shape[0]
    key, value, positions = _new_kv(case, feeds)
    caches = [feeds["past_key"].copy(), feeds["past_value"].copy()]
    exact = [feeds["past_key"].astype(np.float64), feeds["past_value"].astype(np.float64)]
    for r in range(rows):
        for cache, full, fresh in zip(caches, exact, (key, value), strict=True):
            cache[r][:, positions[r]] = fresh[r].transpose(1, 0, 2).astype(np.float16)
            chosen = cache[r][:, positions[r]] if round_new else fresh[r].transpose(1, 0, 2)
            full[r][:, positions[r]] = chosen.astype(np.float64)
    return _attention(case, feeds, exact, positions), caches[0], caches[1]


def _attention(case: dict, feeds: dict[str, np.ndarray], exact: list[np.ndarray],
               positions: list) -> np.ndarray:
    """The output, in float64, of attention over the caches' values `exact` (float64)."""
    heads, kv_heads, head = case["heads"], case["kv_heads"], case["head"]
    rows, new = feeds["query"].shape[:2]
    query = feeds["query"][..., :heads * head].reshape(rows, new, heads, head)
    query = query.astype(np.float64)
    scale = case["scale"] or head ** -0.5
    out = np.zeros((rows, new, heads, head))
    group = heads // kv_heads
    for r in range(rows):
        q = query[r]
        if case["rotary"]:
            cos = feeds["cos_cache"][positions[r]][:, None, :].astype(q.dtype)
            sin = feeds["sin_cache"][positions[r]][:, None, :].astype(q.dtype)
            q = _rotate(q, cos, sin, case["interleaved"])
        for i, pos in enumerate(positions[r]):
            for h in range(heads):
                keys, values = exact[0][r, h // group, :pos + 1], exact[1][r, h // group, :pos + 1]
                scores = keys @ q[i, h] * scale
                weights = np.exp(scores - scores.max())
                out[r, i, h] = weights @ values / weights.sum()
    return out.reshape(rows, new, heads * head)


def _check(case: dict, lengths: list[int], new: int, seed: int = 0) -> None:
    feeds = _feeds(np.random.default_rng(seed + len(lengths) + new), case, lengths, new)
    got = _run(_session(case), feeds)
    want = _reference(case, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-5)
    for mine, theirs in zip(got[1:], want[1:], strict=True):  # every position, bit for bit
        np.testing.assert_array_equal(mine.view(np.uint16), theirs.view(np.uint16))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_decode_step_matches_attention_over_the_float16_cache(case):
    # one row empty, one within a chunk, two across chunks of 512 positions
    _check(case, [0, 37, 700, 1023], new=1)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_prefill_chunk_matches_attention_over_the_float16_cache(case):
    _check(case, [300], new=5)  # few rows: the positions are split among the threads
    _check(case, [0], new=9)
    _check(case, [700], new=70)  # many rows: a task per row and KV head


def test_the_cache_holds_the_new_keys_and_values_rounded_to_nearest_even():
    """Values at float16's edges: ties (to even, both ways), subnormals, the smallest
    subnormal's half (to zero) and a hair above it, the largest float16 and what rounds
    past it (infinity), negative zero. The value input is written as it is (no rotary)."""
    case = CASES["multi-head (4 over 4, 24, separate k and v, no rotary)"]
    edges = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 2 ** -25,
                      2 ** -25 * (1 + 2 ** -20), 3 * 2 ** -25, 1e-6, -3e-7, 6.1e-5, 65504,
                      65519.996, 65520, -1e6, -0.0, 0.1, 2 ** -14 * (1 - 2 ** -12),
                      1 / 3, 7e-8, 5.96e-8, 1e-45, 2047.5, 2048.5, 4097, -np.inf],
                     np.float32)
    feeds = _feeds(np.random.default_rng(3), case, [10], 1)
    feeds["value"][0, 0] = np.resize(edges, feeds["value"].shape[-1])
    feeds["key"][0, 0] *= 1e-3  # finite scores whatever the values
    _, key, value = _run(_session(case), feeds)
    with np.errstate(over="ignore"):  # 65520 and beyond: infinity, as intended
        want_value = feeds["value"][0, 0].reshape(4, 24).astype(np.float16)
    np.testing.assert_array_equal(value[0, :, 10].view(np.uint16), want_value.view(np.uint16))
    want_key = feeds["key"][0, 0].reshape(4, 24).astype(np.float16)
    np.testing.assert_array_equal(key[0, :, 10].view(np.uint16), want_key.view(np.uint16))
    np.testing.assert_array_equal(value[0, :, 11:], 0)  # nothing written past the new token


def _pieces(case: dict, sizes: list[int], past: int = 290, threads: int = 2,
            element: str = "float16", make_feeds: Any = _feeds
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row's prompt of sum(sizes) new tokens after `past` cached ones, in runs of
    `sizes` tokens each (the cache carried between runs, as the engine's prefill chunks and
    decode steps do): every token's output, and the caches (`element`'s, the feeds from
    `make_feeds`)."""
    whole = make_feeds(np.random.default_rng(7), case, [past], sum(sizes))
    session = _session(case, threads, element)
    caches = {n: whole[n] for n in ("past_key", "past_value")}
    outputs, done = [], 0
    for size in sizes:
        feeds = {name: value[:, done:done + size] for name, value in whole.items()
                 if name in ("query", "key", "value")}
        feeds.update(caches, seqlens_k=np.array([past + done + size - 1], np.int32),
                     total_sequence_length=np.array(past + done + size, np.int32))
        if case["rotary"]:
            feeds.update(cos_cache=whole["cos_cache"], sin_cache=whole["sin_cache"])
        out, key, value = _run(session, feeds)
        caches = {"past_key": key, "past_value": value}
        outputs.append(out)
        done += size
    return np.concatenate(outputs, axis=1), caches["past_key"], caches["past_value"]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_token_gets_the_same_bits_alone_or_among_others(case):
    """A prompt run whole, in chunks of 7 and 64, one token at a time (decode steps), or on
    one thread: every token's output and the caches bit for bit the same."""
    want = _pieces(case, [300])
    for sizes, threads in (([7] * 42 + [6], 2), ([64] * 4 + [44], 2), ([1] * 300, 2),
                           ([300], 1)):
        got = _pieces(case, sizes, threads=threads)
        for mine, theirs in zip(got, want, strict=True):  # bits: -0.0 is not 0.0 here
            bits = np.uint32 if mine.itemsize == 4 else np.uint16
            np.testing.assert_array_equal(mine.view(bits), theirs.view(bits))


def _fallback(case: dict, feeds: dict[str, np.ndarray], shared: bool) -> None:
    got = _run(_session(case), feeds, shared=shared)
    want = _reference(case, feeds, round_new=False)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-5)
    for mine, theirs in zip(got[1:], want[1:], strict=True):
        assert mine.dtype == np.float16 and mine.shape == theirs.shape
        # ONNX Runtime's rotary may round a product differently: one float16 step at most
        np.testing.assert_allclose(mine.astype(np.float32), theirs.astype(np.float32),
                                   rtol=2 ** -10, atol=0)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_several_rows_of_several_tokens_get_onnx_runtimes_answer(case):
    """Two rows of three new tokens each (a first prompt: ONNX Runtime takes several rows of
    several tokens only without a past): not the kernel's own shapes, so ONNX Runtime's
    fp32 kernel runs on float32 copies of the float16 caches; the presents come back in
    float16."""
    feeds = _feeds(np.random.default_rng(11), case, [0, 0], 3, capacity=64)
    _fallback(case, feeds, shared=True)


def test_a_present_that_is_not_the_past_gets_onnx_runtimes_answer():
    case = CASES["smollm2 (9 heads over 3, 64, packed, rotary)"]
    feeds = _feeds(np.random.default_rng(12), case, [40, 513], 1, capacity=600)
    _fallback(case, feeds, shared=False)


def test_every_float16_is_read_exactly():
    """All 65,536 float16 bit patterns in the past caches, through the fallback (read into
    float32, copied by ONNX Runtime, rounded back): each comes back as it was (a
    signalling NaN as a quiet one), so reading is exact for subnormals, infinities and
    NaNs too."""
    case = CASES["smollm2 (9 heads over 3, 64, packed, rotary)"]
    feeds = _feeds(np.random.default_rng(13), case, [512], 1, capacity=600)
    patterns = np.resize(np.arange(65536, dtype=np.uint32).astype(np.uint16), (3, 512, 64))
    for name in ("past_key", "past_value"):  # 3 x 512 x 64 = 98,304 values: each at least once
        feeds[name][0, :, :512] = patterns.view(np.float16)
    with np.errstate(all="ignore"):
        _, key, value = _run(_session(case), feeds, shared=False)
    for name, got in (("past_key", key), ("past_value", value)):
        want = feeds[name][0, :, :512].view(np.uint16).copy()
        nan = ((want & 0x7c00) == 0x7c00) & ((want & 0x3ff) != 0)
        want[nan] |= 0x200  # quiet
        np.testing.assert_array_equal(got[0, :, :512].view(np.uint16), want)


@pytest.mark.parametrize("paths", ["portable", "avx2", "avx512"])
def test_the_other_paths_hold_too(tmp_path, paths):
    """Where the CPU lacks AVX-512 the cache is read with F16C and the dot products run in
    AVX2, where it lacks AVX2 in plain C: the reference and invariance cases again, in a
    process told to take those paths (the choice is made once per process)."""
    if os.environ.get(kernels.ENV) in ("portable", "avx2", "avx512"):
        pytest.skip("this process is one of those runs")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
         str(tmp_path / "run"),
         f"{__file__}::test_a_decode_step_matches_attention_over_the_float16_cache",
         f"{__file__}::test_a_prefill_chunk_matches_attention_over_the_float16_cache",
         f"{__file__}::test_a_token_gets_the_same_bits_alone_or_among_others",
         f"{__file__}::test_the_cache_holds_the_new_keys_and_values_rounded_to_nearest_even",
         f"{__file__}::test_every_float16_is_read_exactly"],
        env={**os.environ, kernels.ENV: paths}, capture_output=True, text=True,
        check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "11 passed" in done.stdout
