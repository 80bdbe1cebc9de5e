"""The memory slider's words count the KV the worker really keeps: float16 where the
engine's kernel runs attention on the CPU, half the bytes a token of float32."""

from __future__ import annotations

import pytest

from app.memory_words import MIN_KV_TOKENS, request_floor
from engine import Engine, EngineConfig, kernels

F16 = kernels.library() is not None and kernels.f16kv_ready()


@pytest.mark.parametrize("kv_dtype", ["auto", "float32"])
def test_one_requests_kv_in_the_floor_is_its_tokens_times_the_real_bytes(genai_model_dir,
                                                                           kv_dtype):
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1, kv_dtype=kv_dtype))
    snap = engine.resource_snapshot().as_dict()  # what /v1/resources sends as "governor"
    floor = request_floor(snap["host_ram"], snap["budget"], engine.context_length)
    tokens = min(engine.context_length, MIN_KV_TOKENS)
    per_token = engine.spec.kv_bytes_per_token
    assert per_token == (256 if F16 and kv_dtype == "auto" else 512)  # 2 layers x 2 x 16 x 2
    assert floor.kv_tokens == tokens and floor.kv == tokens * per_token
