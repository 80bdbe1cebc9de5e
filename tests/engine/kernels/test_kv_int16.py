"""Int16 KV on the CPU (`kv_dtype="int16"`, and "auto" where the CPU has VNNI and
heads are a multiple of 32; engine.model.kv16_pass's `cache_kv`): each cache row holds a
token's key or value for one KV head as int16 whole numbers and their bfloat16 scale, the
attention runs on the whole numbers. The paths float16 KV takes (every path's same answer,
sessions, forks, the tiered store) are checked for int16 too in test_kv16.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from engine import kernels
from engine.errors import InvalidOptionError
from engine.model.kv16_pass import I16_OP
from tests.engine.kernels.test_kv8 import check_pass_rows
from tests.engine.kernels.test_kv16 import F16_DRIFT, _greedy, _load, check_close_to_float32
from tests.forge import ForgeSpec, write_genai_model

pytestmark = pytest.mark.skipif(kernels.library() is None or not kernels.i16kv_ready(),
                                reason="the engine's kernels were not built (no C compiler)")
#: The most an int16 cache moved a forged model's logits from a float32 cache's, over the
#: logits' largest magnitude: float16's bound (int16 rows keep 12 bits against their
#: largest value where float16 keeps 11 of each).
I16_DRIFT = F16_DRIFT


@pytest.fixture(scope="module")
def head32(tmp_path_factory) -> Path:
    """A forged model with heads of 32: the VNNI paths' shape."""
    return write_genai_model(tmp_path_factory.mktemp("head32"),
                             ForgeSpec(hidden=128, heads=4, kv_heads=2, context=512))


def test_the_pass_makes_int16_rows_of_head_size_plus_a_scale(genai_model_dir, forge_spec):
    check_pass_rows(genai_model_dir, forge_spec.hd, "int16", TensorProto.INT16, 1, I16_OP)


def test_the_engine_keeps_int16_kv_at_half_of_float32s_bytes_and_a_scale(head32):
    small, full = _load(head32, kv_dtype="int16"), _load(head32, kv_dtype="float32")
    assert {p.dtype for p in small.spec.kv_pairs} == {"int16"}
    assert small.spec.kv_bytes_per_token * 2 * 32 == full.spec.kv_bytes_per_token * (32 + 1)
    kv = small.describe()["kv"]
    assert isinstance(kv, dict) and kv["dtype"] == "int16"
    assert kv["bytes_per_token"] == small.spec.kv_bytes_per_token
    assert small.kernel_use is not None and small.kernel_use.kv_line() == "KV cache int16"
    # the governor counts pages of the rows' real size
    assert small.pool.geometry.page_bytes(32) * 64 == full.pool.geometry.page_bytes(32) * 33
    small.generate(_greedy(tuple(range(5, 45)), 8))
    assert {r.dtype.name for r in small.runner.export_kv(0, 8)} == {"int16"}


def test_auto_keeps_int16_where_the_cpu_runs_it_fast_and_float16_elsewhere(
        head32, genai_model_dir):
    """"auto": int16 where the kernel runs its attention on VNNI (AVX-512 VNNI or AVX-VNNI,
    without AMX) and every head is a multiple of 32; float16 for heads of 16 (the plain C
    loops would run them) and on CPUs without VNNI."""
    want = "int16" if kernels.i16kv_preferred() else "float16"
    assert _load(head32).spec.kv_pairs[0].dtype == want
    assert _load(genai_model_dir).spec.kv_pairs[0].dtype == "float16"  # heads of 16
    assert _load(head32, kv_dtype="float16").spec.kv_pairs[0].dtype == "float16"


def test_int16_asked_for_where_the_kernel_does_not_run_is_a_clear_error(optimum_model_dir):
    with pytest.raises(InvalidOptionError, match="an int16 KV cache cannot be kept") as err:
        _load(optimum_model_dir, kv_dtype="int16")
    assert "auto" in (err.value.hint or "")


@pytest.mark.parametrize("head", [16, 32])
def test_int16_kv_answers_close_to_float32_kv(head32, genai_model_dir, head):
    folder = head32 if head == 32 else genai_model_dir
    check_close_to_float32(_load(folder, kv_dtype="int16"), _load(folder, kv_dtype="float32"),
                           I16_DRIFT)


def test_int16_kv_gives_the_same_answer_in_chunks_of_any_size_with_heads_of_32(head32):
    """The VNNI paths' shape (test_kv16.py covers the other paths with heads of 16)."""
    engine = _load(head32, kv_dtype="int16")
    ids = [5 + (11 * i) % 53 for i in range(300)]
    last = {}
    for size in (1, 7, 64, len(ids)):
        engine.runner.reset()
        for start in range(0, len(ids), size):
            logits = engine.runner.forward(np.array(ids[start:start + size]))
        last[size] = logits.copy()
    for size in (1, 7, 64):
        np.testing.assert_array_equal(last[size], last[len(ids)], err_msg=str(size))
    request = _greedy(tuple(ids), 16)
    first, again = engine.generate(request), engine.generate(request)
    assert again.prefix_cache_hit_len > 0 and again.token_ids == first.token_ids


def test_int16_kv_is_shifted_when_the_oldest_part_of_a_prompt_is_left_out(tmp_path):
    """Reuse by shifting reads the int16 keys as floats (exactly), rotates them and
    quantizes them again: on one layer (a token's KV depends on its position alone) the
    answer is a cold engine's."""
    folder = write_genai_model(tmp_path / "one", ForgeSpec(layers=1, hidden=128, context=1024))
    doc = [int(i) for i in np.random.default_rng(1).integers(9, 500, 720)]
    warm = _load(folder, kv_dtype="int16")
    warm.generate(_greedy(tuple(doc[:700])))
    second = tuple(doc[:4] + doc[304:720])
    result = warm.generate(_greedy(second))
    assert result.prefix_cache_hit_len == 4 + 396 and warm.reuse.shifted_tokens > 0
    cold = _load(folder, kv_dtype="int16", prefix_cache=False)
    assert result.token_ids == cold.generate(_greedy(second)).token_ids


def test_under_a_tight_limit_auto_keeps_int8_and_counts_in_the_16_bit_choice(head32):
    """kv_dtype "auto" under a host RAM limit whose room cannot hold the context in 16 bits:
    int8, and the reason counts the tokens of the 16-bit element auto would have kept."""
    from engine.model.model_dir import load_model_dir

    wide = "int16" if kernels.i16kv_preferred() else "float16"
    weights = load_model_dir(head32).weights_bytes // 1024 + 1  # KiB, rounded up
    per_token = 2 * 2 * 2 * (32 + (wide == "int16")) * 2  # layers x K,V x kv heads x row
    room = 512 * per_token // 1024 // 2  # KiB: half the context
    tight = _load(head32, host_ram_limit=f"{weights + room}KiB")
    assert tight.spec.kv_pairs[0].dtype == "int8"
    line = (tight.kernel_use.kv_line() if tight.kernel_use else "") or ""
    assert line.startswith("KV cache int8 (the memory limit leaves") and \
        line.endswith(f"{wide} tokens of the context's 512)"), line
