"""The engine's GroupQueryAttention over an int16 KV cache (engine.kernels::
GroupQueryAttentionI16KV, engine/kernels/decode_attention.c).

A cache row (one token, one KV head) is head_size int16 whole numbers and their scale as a
bfloat16 in one more int16: scale = largest |x| / M rounded up to a bfloat16 (M =
i16_row_limit(head_size)), q = x / scale rounded to nearest even, value = q * scale. The
attention runs on the whole numbers: a score is ((float32)(q . k, exact) * the query's
scale) * the key's scale, the query as whole numbers of at most i16_limit(head_size); the
weighted values go tile by tile (64 positions), the weights times each value row's scale
as whole numbers against the tile's largest, the tile's exact sums times the weights' scale
added to the total. The operator's promise: the cache holds exactly engine.kv.quant's rows
of the new keys and values, the output matches that arithmetic modelled in numpy, and a
token's output has the same bits alone, in chunks of any size, on one or two threads, and
on every path (VPDPWSSD on AVX-512 VNNI, on AVX-VNNI's 256-bit registers where AVX-512 is
left out, and the plain C loops).
Real ONNX Runtime sessions, one node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import kernels
from engine.kv.quant import float_to_rows, rows_to_float
from engine.model.kv16_pass import i16_limit, i16_row_limit
from tests.engine.kernels.test_decode_attention_f16kv import (
    CASES,
    _attention,
    _feeds,
    _new_kv,
    _rotate,
    _run,
)
from tests.engine.kernels.test_decode_attention_f16kv import _pieces as _pieces_of
from tests.engine.kernels.test_decode_attention_f16kv import _session as _session_of

pytestmark = pytest.mark.skipif(kernels.library() is None or not kernels.i16kv_ready(),
                                reason="the engine's kernels were not built (no C compiler)")

#: Positions whose weighted values the kernel sums at once (decode_attention.c's TILE).
TILE = 64
#: The float16 cases and more head sizes for the whole numbers: 32 and 96 (the VNNI path's
#: one-vector-at-a-time weighted sums), and a sliding window over heads of 64.
I16_CASES = {
    **CASES,
    "8 over 4, 32, packed, rotary": dict(heads=8, kv_heads=4, head=32, packed=True, rotary=True,
                                         interleaved=False, scale=0.0),
    "6 over 2, 96, separate k and v, no rotary": dict(heads=6, kv_heads=2, head=96,
                                                      packed=False, rotary=False,
                                                      interleaved=False, scale=0.0),
    "smollm2's shape, a window of 100": dict(heads=9, kv_heads=3, head=64, packed=True,
                                             rotary=True, interleaved=False, scale=0.125,
                                             window=100),
}


def _session(case: dict, threads: int = 2):
    return _session_of(case, threads, "int16")


def _int16_feeds(rng: np.random.Generator, case: dict, lengths: list[int], new: int,
                 capacity: int = 1100) -> dict[str, np.ndarray]:
    """`_feeds` with the caches as int16 rows (the float16 caches' values quantized)."""
    feeds = _feeds(rng, case, lengths, new, capacity)
    for name in ("past_key", "past_value"):
        feeds[name] = float_to_rows(feeds[name].astype(np.float32), "int16")
    return feeds


def _whole(x: np.ndarray, limit: int) -> tuple[np.ndarray, np.float32]:
    """A float32 vector as whole numbers: x * (limit / its largest |x|) rounded to nearest
    even (float32 arithmetic), and its scale, largest / limit."""
    top = np.float32(np.abs(x).max())
    inv = np.float32(limit) / top if top > 0 else np.float32(0)
    return np.rint(x * inv).astype(np.int64), np.float32(top / np.float32(limit))


def _split(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int16 rows as their whole numbers (int64) and scales (float32)."""
    d = rows.shape[-1] - 1
    scales = (rows[..., d].view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return rows[..., :d].astype(np.int64), scales


def _rows_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, first: int = 0
                    ) -> np.ndarray:
    """One query vector's attention (q rotated and scaled, float32) over int16 rows, as the
    kernel computes it (float64 only for the exponentials and the final sums); positions
    before `first` (a sliding window's start) weigh 0, the tiles still at fixed places."""
    qi, qs = _whole(q.astype(np.float32), i16_limit(q.shape[-1]))
    ki, ks = _split(keys)
    vi, vs = _split(values)
    scores = ((ki @ qi).astype(np.float32) * qs * ks).astype(np.float64)
    weights = np.exp(scores - scores[first:].max())
    weights[:first] = 0.0
    out = np.zeros(q.shape[-1])
    for t in range(0, len(weights), TILE):
        wi, ws = _whole(weights[t:t + TILE].astype(np.float32) * vs[t:t + TILE], i16_limit(TILE))
        out += (wi @ vi[t:t + TILE]).astype(np.float32).astype(np.float64) * float(ws)
    return out / weights.sum()


def _reference(case: dict, feeds: dict[str, np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The output the operator promises and its int16 caches (the new rows quantized first)."""
    heads, kv_heads, head = case["heads"], case["kv_heads"], case["head"]
    rows, new = feeds["query"].shape[:2]
    key, value, positions = _new_kv(case, feeds)
    caches = [feeds["past_key"].copy(), feeds["past_value"].copy()]
    for r in range(rows):
        for cache, fresh in zip(caches, (key, value), strict=True):
            cache[r][:, positions[r]] = float_to_rows(fresh[r].transpose(1, 0, 2), "int16")
    query = feeds["query"][..., :heads * head].reshape(rows, new, heads, head)
    # the kernel's scale: 1 / sqrtf(head) in float32 where the node gives none
    scale = np.float32(case["scale"]) if case["scale"] else \
        np.float32(1) / np.sqrt(np.float32(head))
    out = np.zeros((rows, new, heads, head))
    group = heads // kv_heads
    for r in range(rows):
        q = query[r]
        if case["rotary"]:
            cos = feeds["cos_cache"][positions[r]][:, None, :]
            sin = feeds["sin_cache"][positions[r]][:, None, :]
            q = _rotate(q, cos, sin, case["interleaved"])
        for i, pos in enumerate(positions[r]):
            first = max(0, pos + 1 - case.get("window", pos + 1))
            for h in range(heads):
                out[r, i, h] = _rows_attention(q[i, h] * scale, caches[0][r, h // group, :pos + 1],
                                               caches[1][r, h // group, :pos + 1], first)
    return out.reshape(rows, new, heads * head), caches[0], caches[1]


def _check(case: dict, lengths: list[int], new: int) -> None:
    feeds = _int16_feeds(np.random.default_rng(len(lengths) + new), case, lengths, new)
    got = _run(_session(case), feeds)
    want = _reference(case, feeds)
    # measured within 3e-6 of the model, but a weight's whole number can land one step off
    # where numpy's exponential rounds otherwise than the kernel's (3.5e-5 seen with a
    # window of 100 positions); float arithmetic over the same values is ~1e-3 off
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-4)
    for mine, theirs in zip(got[1:], want[1:], strict=True):  # every row, bit for bit
        assert mine.dtype == np.int16 and mine.shape[-1] == case["head"] + 1
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("case", I16_CASES.values(), ids=I16_CASES.keys())
def test_a_decode_step_matches_the_whole_number_attention(case):
    # one row empty, one within a chunk, two across chunks of 512 positions
    _check(case, [0, 37, 700, 1023], new=1)


@pytest.mark.parametrize("case", I16_CASES.values(), ids=I16_CASES.keys())
def test_a_prefill_chunk_matches_the_whole_number_attention(case):
    _check(case, [300], new=5)  # few rows: the positions are split among the threads
    _check(case, [0], new=9)
    _check(case, [700], new=70)  # many rows: a task per row block and KV head


def test_the_model_is_the_whole_number_arithmetic_not_float_attention():
    """The reference above tells the kernel's arithmetic from float attention over the same
    dequantized values: those differ by far more than the test's tolerance."""
    case = CASES["smollm2 (9 heads over 3, 64, packed, rotary)"]
    feeds = _int16_feeds(np.random.default_rng(5), case, [700], 1)
    whole, caches = _reference(case, feeds)[0], _reference(case, feeds)[1:]
    _, _, positions = _new_kv(case, feeds)
    floats = _attention(case, feeds, [rows_to_float(c).astype(np.float64) for c in caches],
                        positions)
    assert np.abs(whole - floats).max() > 3e-4


def test_rows_quantize_as_the_engine_does_at_their_edges():
    """An all-zero row keeps scale 0 (read back as zeros, not NaN); a row with one large
    value keeps it within half a step, no whole number past the limit (the scale is rounded
    up, so nothing clips); a row holding inf gets an infinite scale (it reads back as NaN,
    as float16 would keep the inf). Byte for byte what engine.kv.quant.float_to_rows
    writes (the engine's key shifting uses it)."""
    case = CASES["multi-head (4 over 4, 24, separate k and v, no rotary)"]
    feeds = _int16_feeds(np.random.default_rng(3), case, [10], 1)
    feeds["value"][0, 0, :24] = 0.0
    feeds["value"][0, 0, 24:48] = np.linspace(-1, 1, 24, dtype=np.float32)
    feeds["value"][0, 0, 30] = -1000.0
    feeds["value"][0, 0, 48] = np.inf
    feeds["key"][0, 0] *= 1e-3  # finite scores whatever the values
    _, _, value = _run(_session(case), feeds)
    zeros, large, infinite = value[0, 0, 10], value[0, 1, 10], value[0, 2, 10]
    assert not zeros.any()  # whole numbers and the scale's bits all 0
    assert not infinite[:24].any() and infinite[24].view(np.uint16) == 0x7F80
    limit = i16_row_limit(24)
    assert np.abs(large[:24].astype(np.int64)).max() <= limit
    back = rows_to_float(large)
    scale = float(back[6] / large[6])
    assert large[6] <= -limit * (1 - 2 ** -7) and abs(back[6] + 1000.0) <= scale / 2
    np.testing.assert_array_equal(large, float_to_rows(feeds["value"][0, 0, 24:48], "int16"))
    np.testing.assert_array_equal(infinite, float_to_rows(feeds["value"][0, 0, 48:72], "int16"))
    assert not value[0, :, 11:].any()  # nothing written past the new token


def _pieces(case: dict, sizes: list[int], threads: int = 2):
    return _pieces_of(case, sizes, threads=threads, element="int16", make_feeds=_int16_feeds)


@pytest.mark.parametrize("case", I16_CASES.values(), ids=I16_CASES.keys())
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
    """Not the kernel's own shapes: ONNX Runtime's fp32 kernel on float32 copies of the
    int16 caches (exact), the presents quantized back row by row."""
    feeds = _int16_feeds(np.random.default_rng(11), case, [0, 0], 3, capacity=64)
    got = _run(_session(case), feeds)
    key, value, positions = _new_kv(case, feeds)
    exact = [rows_to_float(feeds[n]).astype(np.float64) for n in ("past_key", "past_value")]
    for r in range(2):  # the fallback attends to the new rows before their quantization
        for full, fresh in zip(exact, (key, value), strict=True):
            full[r][:, positions[r]] = fresh[r].transpose(1, 0, 2)
    np.testing.assert_allclose(got[0], _attention(case, feeds, exact, positions), rtol=0,
                               atol=2e-5)
    for mine, full in zip(got[1:], exact, strict=True):
        assert mine.dtype == np.int16 and mine.shape[-1] == case["head"] + 1
        # ONNX Runtime's rotary may round a product differently: one step at most
        np.testing.assert_allclose(rows_to_float(mine), full, rtol=0,
                                   atol=float(np.abs(full).max()) / i16_row_limit(case["head"]))


def _save_pieces(path: str) -> None:
    """Every case's outputs and caches for one prompt in chunks of 7 into `path` (run in a
    process told to take other paths)."""
    arrays = {}
    for i, case in enumerate(I16_CASES.values()):
        for j, a in enumerate(_pieces(case, [7] * 42 + [6])):
            arrays[f"{i}-{j}"] = a
    np.savez(path, **arrays)


@pytest.mark.parametrize("paths", ["portable", "avx2"])
def test_every_path_gives_the_same_bits(tmp_path, paths):
    """With AVX-512 left out ("avx2") the whole numbers run on AVX-VNNI's 256-bit
    VPDPWSSD where the CPU has it, else in plain C; "portable" always runs plain C: the
    same outputs and caches, bit for bit, as this process's VPDPWSSD path."""
    if not kernels.i16kv_fast():
        pytest.skip("this CPU runs the whole numbers in plain C on every path: nothing to "
                    "compare them with")
    out = tmp_path / f"{paths}.npz"
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r}); "
            "from tests.engine.kernels.test_decode_attention_i16kv import _save_pieces; "
            f"_save_pieces({str(out)!r})")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, kernels.ENV: paths},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = np.load(out)
    for i, case in enumerate(I16_CASES.values()):
        for j, mine in enumerate(_pieces(case, [7] * 42 + [6])):
            np.testing.assert_array_equal(mine.view(np.uint8), theirs[f"{i}-{j}"].view(np.uint8))
