"""Checks that need an NVIDIA GPU with onnxruntime-gpu (marker `gpu`; skipped elsewhere).

Run by tools/gpu_check.sh on a machine with a GPU:
    python -m pytest -m gpu tests/engine/runtime/test_gpu.py
"""

from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig, GenerateOptions
from engine.engine import Engine, GenerateRequest
from engine.runtime.decode_device import DeviceRunner


def _cuda_available() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _cuda_available(),
                                 reason="needs onnxruntime-gpu and a CUDA device")]

PROMPT = (5, 17, 42, 99, 7, 300, 12, 8, 9, 10)
REQUEST = GenerateRequest(token_ids=PROMPT,
                          options=GenerateOptions(max_new_tokens=48, temperature=0.0))


def _load(folder, **kw) -> Engine:
    return Engine.load(folder, EngineConfig(intra_op_threads=1, **kw))


@pytest.fixture(scope="module")
def cpu_tokens(genai_model_dir):
    return _load(genai_model_dir, provider="cpu").generate(REQUEST).token_ids


def test_cuda_greedy_tokens_equal_cpu_greedy(genai_model_dir, cpu_tokens):
    engine = _load(genai_model_dir, provider="cuda")
    assert engine.provider == "cuda"
    assert isinstance(engine.runner, DeviceRunner)
    assert engine.generate(REQUEST).token_ids == cpu_tokens


def test_kv_and_logits_stay_on_the_device(genai_model_dir):
    engine = _load(genai_model_dir, provider="cuda", prefix_cache=False)
    runner = engine.runner
    assert isinstance(runner, DeviceRunner)
    runner.reserve(len(PROMPT) + 64)
    before = runner.host_copy_bytes
    runner.forward(np.array(PROMPT, dtype=np.int64))
    token = 3
    for _ in range(32):
        token = runner.forward_greedy(np.array([token], dtype=np.int64))
    assert runner.host_copy_bytes == before  # no KV crossed while decoding
    assert runner.kv_device.lower() == "cuda"
    assert all(v.device_name().lower() == "cuda" for v in runner._kv)
    assert runner._logits.device_name().lower() == "cuda"
    assert engine.describe()["kv_device"] == "cuda"


def test_cuda_graph_on_and_off_give_identical_tokens(genai_model_dir, cpu_tokens):
    eager = _load(genai_model_dir, provider="cuda", cuda_graph=False)
    graph = _load(genai_model_dir, provider="cuda", cuda_graph=True)
    info: Any = graph.describe()["cuda_graph"]
    assert info["enabled"], info  # the forged GQA model is structurally safe
    want = eager.generate(REQUEST).token_ids
    assert graph.generate(REQUEST).token_ids == want == cpu_tokens
    assert isinstance(graph.runner, DeviceRunner)
    assert graph.runner.capture_failure is None, graph.runner.capture_failure
    again = graph.generate(REQUEST).token_ids  # replay after rewind / reuse
    assert again == want


def test_cuda_graph_declined_for_growing_kv(optimum_model_dir):
    engine = _load(optimum_model_dir, provider="cuda", cuda_graph=True)
    info: Any = engine.describe()["cuda_graph"]
    assert not info["enabled"] and "dynamic shapes" in info["reason"]


def test_vram_limit_caps_the_cuda_arena(genai_model_dir):
    engine = _load(genai_model_dir, provider="cuda", vram_limit="2GiB")
    options = engine.session.get_provider_options()["CUDAExecutionProvider"]
    assert int(options["gpu_mem_limit"]) <= 2 << 30
    assert options["arena_extend_strategy"] == "kSameAsRequested"
    assert engine.governor.kv_tier == "vram"
    snap = engine.resource_snapshot()
    assert snap.vram.limit is not None and snap.vram.limit <= 2 << 30
    assert snap.breakdown.kv_vram_bytes == engine.kv_bytes() > 0
