"""The catalog's fit counts the KV the engine will keep: 16 bits on the CPU where its
kernel runs attention (engine.model.kv16_pass; int16 rows with a scale where the CPU runs
them on VNNI), the export's own elsewhere."""

from __future__ import annotations

import pytest

from engine import EngineConfig, kernels
from engine.hub.fit import assess
from engine.hub.remote import ModelShape

MIB = 1 << 20
F16 = kernels.library() is not None and kernels.f16kv_ready()
SHAPE = ModelShape(layers=30, kv_heads=3, head_dim=64, context=8192, kv_dtype_bytes=4)
#: An int16 row's scale: one more int16 a row (2 x 30 layers x 3 KV heads x 2 bytes).
SCALES = 360 if F16 and kernels.i16kv_preferred() else 0


@pytest.mark.skipif(not F16, reason="the engine's kernels lack the float16-KV attention")
def test_a_float32_export_on_the_cpu_counts_two_bytes_a_value():
    fit = assess(100 * MIB, SHAPE, EngineConfig(), provider="cpu", bandwidth=1e10)
    assert fit.kv_bytes_per_token == SHAPE.kv_bytes_per_token // 2 + SCALES == 23040 + SCALES
    half = assess(100 * MIB, SHAPE, EngineConfig(kv_dtype="float16"), provider="cpu",
                  bandwidth=1e10)
    assert half.kv_bytes_per_token == 23040
    whole = assess(100 * MIB, SHAPE, EngineConfig(kv_dtype="int16"), provider="cpu",
                   bandwidth=1e10)
    assert whole.kv_bytes_per_token == 23040 + 360


@pytest.mark.parametrize(("config", "provider"), [
    (EngineConfig(kv_dtype="float32"), "cpu"),
    (EngineConfig(own_kernels=False), "cpu"),
])
def test_otherwise_the_exports_own_bytes_are_counted(config, provider):
    fit = assess(100 * MIB, SHAPE, config, provider=provider, bandwidth=1e10)
    assert fit.kv_bytes_per_token == SHAPE.kv_bytes_per_token == 46080
