"""Int8 KV on the CPU (`kv_dtype="int8"`, engine.model.kv16_pass's `cache_kv`): each cache
row holds a token's key or value for one KV head as int8 values and their bfloat16 scale,
a quarter of float32's bytes and a bit. The paths float16 KV takes (every path's same answer,
sessions, forks, the tiered store) are checked for int8 too in test_kv16.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from engine import Engine, EngineConfig, GenerateOptions, GenerateRequest, kernels
from engine.errors import InvalidOptionError
from engine.model.graph_passes import KERNEL_DOMAIN, own_attention
from engine.model.kv16_pass import I8_OP, cache_kv
from tests.engine.kernels.test_kv16 import check_close_to_float32
from tests.forge import ForgeSpec, write_genai_model

pytestmark = pytest.mark.skipif(kernels.library() is None or not kernels.i8kv_ready(),
                                reason="the engine's kernels were not built (no C compiler)")
#: The most an int8 cache moved a forged model's logits from a float32 cache's, over the
#: logits' largest magnitude (measured: 1.4e-2 on genai_model_dir, 200 + 40 tokens;
#: float16: 6.2e-4).
I8_DRIFT = 4e-2


def _load(folder: Path, **config: Any) -> Engine:
    return Engine.load(folder, EngineConfig(intra_op_threads=2, **config))


def _greedy(ids: tuple[int, ...], n: int = 16) -> GenerateRequest:
    return GenerateRequest(token_ids=ids, options=GenerateOptions(
        max_new_tokens=n, temperature=0.0, stop_on_eos=False))


def check_pass_rows(folder: Path, head: int, dtype: str, element: int, extra: int,
                    op: str) -> None:
    """engine.model.kv16_pass.cache_kv(..., dtype) on the forged two-layer model at `folder`:
    its eight KV tensors become `element` rows of head + `extra`, its two attention nodes
    `op` in the engine's domain, and a head size it is not told is refused."""
    moved = own_attention((folder / "model.onnx").read_bytes())
    assert moved is not None
    names = [f"{d}.{i}.{k}" for d in ("past_key_values", "present") for i in range(2)
             for k in ("key", "value")]
    cached, why = cache_kv(moved, dtype, dict.fromkeys(names, head))
    assert why is None and cached is not None
    model = onnx.load_from_string(cached)
    kv = [v for v in (*model.graph.input, *model.graph.output)
          if v.name.startswith(("past", "present"))]
    assert len(kv) == 8
    for value in kv:
        assert value.type.tensor_type.elem_type == element
        assert value.type.tensor_type.shape.dim[-1].dim_value == head + extra
    attention = [n for n in model.graph.node if "GroupQueryAttention" in n.op_type]
    assert [(n.op_type, n.domain) for n in attention] == [(op, KERNEL_DOMAIN)] * 2
    assert cache_kv(moved, dtype, {})[1] == "a KV tensor's head size is not known"


def test_the_pass_makes_int8_rows_of_head_size_plus_a_scale(genai_model_dir, forge_spec):
    check_pass_rows(genai_model_dir, forge_spec.hd, "int8", TensorProto.INT8, 2, I8_OP)


def test_the_engine_keeps_int8_kv_at_about_a_quarter_of_float32s_bytes(genai_model_dir,
                                                                       forge_spec):
    small, full = _load(genai_model_dir, kv_dtype="int8"), _load(genai_model_dir,
                                                                 kv_dtype="float32")
    assert {p.dtype for p in small.spec.kv_pairs} == {"int8"}
    head = forge_spec.hd
    assert small.spec.kv_bytes_per_token * 4 * head == full.spec.kv_bytes_per_token * (head + 2)
    kv = small.describe()["kv"]
    assert isinstance(kv, dict) and kv["dtype"] == "int8"
    assert small.kernel_use is not None and small.kernel_use.kv_line() == "KV cache int8"
    small.generate(_greedy(tuple(range(5, 45)), 8))
    assert {r.dtype.name for r in small.runner.export_kv(0, 8)} == {"int8"}


def test_int8_asked_for_where_the_kernel_does_not_run_is_a_clear_error(optimum_model_dir):
    with pytest.raises(InvalidOptionError, match="an int8 KV cache cannot be kept") as err:
        _load(optimum_model_dir, kv_dtype="int8")
    assert "auto" in (err.value.hint or "")


def test_int8_kv_answers_close_to_float32_kv(genai_model_dir):
    check_close_to_float32(_load(genai_model_dir, kv_dtype="int8"),
                           _load(genai_model_dir, kv_dtype="float32"), I8_DRIFT, differ=False)


def test_int8_kv_is_shifted_when_the_oldest_part_of_a_prompt_is_left_out(tmp_path):
    """Reuse by shifting reads the int8 keys as floats, rotates them and quantizes them
    again: on one layer (a token's KV depends on its position alone) the answer is a cold
    engine's."""
    folder = write_genai_model(tmp_path / "one", ForgeSpec(layers=1, context=1024))
    doc = [int(i) for i in np.random.default_rng(1).integers(9, 500, 720)]
    warm = _load(folder, kv_dtype="int8")
    warm.generate(_greedy(tuple(doc[:700])))
    second = tuple(doc[:4] + doc[304:720])
    result = warm.generate(_greedy(second))
    assert result.prefix_cache_hit_len == 4 + 396 and warm.reuse.shifted_tokens > 0
    cold = _load(folder, kv_dtype="int8", prefix_cache=False)
    assert result.token_ids == cold.generate(_greedy(second)).token_ids


def test_under_a_limit_that_cannot_hold_the_context_in_float16_the_kv_is_int8(
        genai_model_dir):
    """kv_dtype "auto" with a host RAM limit: float16 where the limit's room beside the
    weights holds the whole context in float16, else int8 (about twice the tokens), with
    the reason; asked for float16, float16 whatever the limit."""
    from engine.model.model_dir import load_model_dir

    weights = load_model_dir(genai_model_dir).weights_bytes // 1024 + 1  # KiB, rounded up
    roomy = _load(genai_model_dir, host_ram_limit=f"{weights + 100}KiB")
    assert roomy.spec.kv_pairs[0].dtype == "float16"  # 256 tokens x 256 bytes fit
    tight = _load(genai_model_dir, host_ram_limit=f"{weights + 50}KiB")
    assert tight.spec.kv_pairs[0].dtype == "int8"  # 64 KiB do not; 40 KiB of int8 do
    assert tight.kernel_use is not None
    line = tight.kernel_use.kv_line() or ""
    assert line.startswith("KV cache int8 (the memory limit leaves 50") and \
        line.endswith("float16 tokens of the context's 256)"), line
    budget = tight.governor.budget()
    assert budget is not None and budget.kv_tokens is not None
    assert budget.kv_tokens >= tight.context_length
    asked = _load(genai_model_dir, host_ram_limit=f"{weights + 50}KiB", kv_dtype="float16")
    assert asked.spec.kv_pairs[0].dtype == "float16"
