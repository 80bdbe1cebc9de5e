"""The engine's GroupQueryAttention over an int8 KV cache (engine.kernels::
GroupQueryAttentionI8KV, engine/kernels/decode_attention.c).

A cache row (one token, one KV head) is head_size int8 values and their bfloat16 scale:
scale = largest |x| / 127 rounded to a bfloat16, q = x / scale rounded to nearest even,
value = q * scale.
The operator's promise, as with float16: each new key (after rotary) and value is
quantized into the cache first, and the attention reads the cache's values; so the cache
must hold exactly engine.kv.quant's rows of the new keys and values (the same quantization
the engine uses when it shifts keys), the output must match attention computed in float64
over the dequantized cache, and a token's output must have the same bits alone, in chunks
of any size, on one or two threads, on every path. Real ONNX Runtime sessions, one node.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from engine import kernels
from engine.kv.quant import float_to_rows, rows_to_float
from tests.engine.kernels.test_decode_attention_f16kv import (
    CASES,
    _attention,
    _feeds,
    _new_kv,
    _run,
)
from tests.engine.kernels.test_decode_attention_f16kv import _pieces as _pieces_of
from tests.engine.kernels.test_decode_attention_f16kv import _session as _session_of

pytestmark = pytest.mark.skipif(kernels.library() is None or not kernels.i8kv_ready(),
                                reason="the engine's kernels were not built (no C compiler)")


def _session(case: dict, threads: int = 2):
    return _session_of(case, threads, "int8")


def _int8_feeds(rng: np.random.Generator, case: dict, lengths: list[int], new: int,
                capacity: int = 1100) -> dict[str, np.ndarray]:
    """`_feeds` with the caches as int8 rows (the float16 caches' values quantized)."""
    feeds = _feeds(rng, case, lengths, new, capacity)
    for name in ("past_key", "past_value"):
        feeds[name] = float_to_rows(feeds[name].astype(np.float32))
    return feeds


def _reference(case: dict, feeds: dict[str, np.ndarray], *, quantize_new: bool = True
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The output (float64) and the int8 caches the operator promises (`quantize_new`:
    the attention reads the new rows quantized, else as computed: the fallback's)."""
    rows = feeds["query"].shape[0]
    key, value, positions = _new_kv(case, feeds)
    caches = [feeds["past_key"].copy(), feeds["past_value"].copy()]
    exact = [rows_to_float(c).astype(np.float64) for c in caches]
    for r in range(rows):
        for cache, full, fresh in zip(caches, exact, (key, value), strict=True):
            cache[r][:, positions[r]] = float_to_rows(fresh[r].transpose(1, 0, 2))
            chosen = rows_to_float(cache[r][:, positions[r]]) if quantize_new \
                else fresh[r].transpose(1, 0, 2)
            full[r][:, positions[r]] = chosen.astype(np.float64)
    return _attention(case, feeds, exact, positions), caches[0], caches[1]


def _check(case: dict, lengths: list[int], new: int) -> None:
    feeds = _int8_feeds(np.random.default_rng(len(lengths) + new), case, lengths, new)
    got = _run(_session(case), feeds)
    want = _reference(case, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-5)
    for mine, theirs in zip(got[1:], want[1:], strict=True):  # every row, byte for byte
        assert mine.dtype == np.int8 and mine.shape[-1] == case["head"] + 2
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_decode_step_matches_attention_over_the_int8_cache(case):
    _check(case, [0, 37, 700, 1023], new=1)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_prefill_chunk_matches_attention_over_the_int8_cache(case):
    _check(case, [300], new=5)
    _check(case, [0], new=9)
    _check(case, [700], new=70)  # many rows: the transposed tiles


def test_rows_of_zeros_and_of_one_large_value_quantize_as_the_engine_does():
    """An all-zero row keeps scale 0 (and reads back as zeros, not NaN); a row with one
    large value keeps it as q = ±127, within the bfloat16 scale's rounding (2^-8 of it),
    and rounds the rest to its steps."""
    case = CASES["multi-head (4 over 4, 24, separate k and v, no rotary)"]
    feeds = _int8_feeds(np.random.default_rng(3), case, [10], 1)
    feeds["value"][0, 0, :24] = 0.0
    feeds["value"][0, 0, 24:48] = np.linspace(-1, 1, 24, dtype=np.float32)
    feeds["value"][0, 0, 30] = -1000.0
    _, _, value = _run(_session(case), feeds)
    row0, row1 = value[0, 0, 10], value[0, 1, 10]
    assert not row0[:24].any() and not row0[24:].any()  # q and the scale's bits all 0
    back = rows_to_float(row1)
    assert row1[6] == -127 and abs(back[6] + 1000.0) <= 1000.0 * 2**-8
    np.testing.assert_array_equal(row1, float_to_rows(feeds["value"][0, 0, 24:48]))
    assert not value[0, :, 11:].any()  # nothing written past the new token


def _pieces(case: dict, sizes: list[int], threads: int = 2):
    return _pieces_of(case, sizes, threads=threads, element="int8", make_feeds=_int8_feeds)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_token_gets_the_same_bits_alone_or_among_others(case):
    want = _pieces(case, [300])
    for sizes, threads in (([7] * 42 + [6], 2), ([64] * 4 + [44], 2), ([1] * 300, 2),
                           ([300], 1)):
        got = _pieces(case, sizes, threads=threads)
        np.testing.assert_array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_several_rows_of_several_tokens_get_onnx_runtimes_answer(case):
    """Not the kernel's own shapes: ONNX Runtime's fp32 kernel on float32 copies of the int8
    caches, the presents quantized back row by row."""
    feeds = _int8_feeds(np.random.default_rng(11), case, [0, 0], 3, capacity=64)
    got = _run(_session(case), feeds)
    want = _reference(case, feeds, quantize_new=False)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-5)
    for mine, theirs in zip(got[1:], want[1:], strict=True):
        assert mine.dtype == np.int8 and mine.shape == theirs.shape
        # ONNX Runtime's rotary may round a product differently: one step at most
        np.testing.assert_allclose(rows_to_float(mine), rows_to_float(theirs), rtol=0,
                                   atol=float(np.abs(rows_to_float(theirs)).max()) / 127)


@pytest.mark.parametrize("paths", ["portable", "avx2", "avx512"])
def test_the_other_paths_hold_too(tmp_path, paths):
    if os.environ.get(kernels.ENV) in ("portable", "avx2", "avx512"):
        pytest.skip("this process is one of those runs")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
         str(tmp_path / "run"),
         f"{__file__}::test_a_decode_step_matches_attention_over_the_int8_cache",
         f"{__file__}::test_a_prefill_chunk_matches_attention_over_the_int8_cache",
         f"{__file__}::test_a_token_gets_the_same_bits_alone_or_among_others",
         f"{__file__}::test_rows_of_zeros_and_of_one_large_value_quantize_as_the_engine_does"],
        env={**os.environ, kernels.ENV: paths}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "10 passed" in done.stdout
