"""Device-resident KV runner (engine.decode_device) on the CPU: the code path CUDA runs,
with device='cpu' buffers. The GPU-only parts (CUDA buffers, graph replay) are in
tests/engine/runtime/test_gpu.py."""

import numpy as np
import onnxruntime as ort
import pytest

from engine.config import EngineConfig, GenerateOptions
from engine.engine import Engine, GenerateRequest
from engine.runtime.decode_device import DeviceRunner, argmax_model_bytes
from engine.runtime.runner import DeviceOptions

PROMPT = np.array([5, 17, 42, 99, 7, 300, 12, 8, 9, 10], dtype=np.int64)
STEPS = 80  # past the first growth step (64)


@pytest.fixture(scope="module")
def host_engine(genai_model_dir):
    return Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1, device_kv=False))


def _device_runner(engine, **kw):
    return DeviceRunner(engine.session, engine.spec, engine.context_length,
                        DeviceOptions("cpu", **kw))


def _greedy(runner, n, *, on_device):
    runner.reset()
    token = int(np.argmax(runner.forward(PROMPT)))
    out = [token]
    for _ in range(n - 1):
        step = np.array([token], dtype=np.int64)
        token = runner.forward_greedy(step) if on_device else int(np.argmax(runner.forward(step)))
        out.append(token)
    return out


@pytest.mark.parametrize("static", [False, True], ids=["growing-mask", "static-shapes"])
def test_device_runner_greedy_matches_host_runner(host_engine, static):
    """Greedy tokens with the argmax on the device equal the host bank's numpy argmax; the
    static-shape step (full-capacity mask, what a CUDA graph replays) changes nothing."""
    expected = _greedy(host_engine.runner, STEPS, on_device=False)
    runner = _device_runner(host_engine, static_shapes=static)
    assert _greedy(runner, STEPS, on_device=True) == expected
    assert _greedy(runner, STEPS, on_device=False) == expected  # logits copied to the host


def test_device_runner_logits_equal_host_logits(host_engine):
    host = host_engine.runner
    host.reset()
    want = host.forward(PROMPT).copy()
    want_step = host.forward(np.array([3], dtype=np.int64)).copy()
    runner = _device_runner(host_engine, static_shapes=True)
    np.testing.assert_array_equal(runner.forward(PROMPT), want)
    np.testing.assert_array_equal(runner.forward(np.array([3], dtype=np.int64)), want_step)


def test_decode_copies_no_kv_to_the_host(host_engine):
    """Growth happens at reserve(); after it, decode steps move no KV across."""
    runner = _device_runner(host_engine)
    runner.reserve(len(PROMPT) + STEPS)
    before = runner.host_copy_bytes
    _greedy(runner, STEPS, on_device=True)
    assert runner.host_copy_bytes == before
    assert runner.kv_device.lower() == "cpu"


def test_rewind_export_import_roundtrip(host_engine):
    runner = _device_runner(host_engine)
    runner.forward(PROMPT)
    after = runner.forward(np.array([3], dtype=np.int64)).copy()
    rows = runner.export_kv(0, len(PROMPT))
    assert rows[0].shape[1] == len(PROMPT)
    runner.reset()
    runner.import_kv(rows, 0, PROMPT.tolist())
    np.testing.assert_array_equal(runner.forward(np.array([3], dtype=np.int64)), after)
    runner.rewind(1)
    np.testing.assert_array_equal(runner.forward(np.array([3], dtype=np.int64)), after)


def test_argmax_session_ties_pick_the_lowest_id():
    sess = ort.InferenceSession(argmax_model_bytes("float32"),
                                providers=["CPUExecutionProvider"])
    logits = np.array([[[0.0, 2.0, 1.0, 2.0]]], dtype=np.float32)
    (token,) = sess.run(None, {"logits": logits})
    assert int(token[0, 0]) == int(np.argmax(logits)) == 1


def test_engine_with_device_kv_generates_host_tokens(genai_model_dir, host_engine):
    request = GenerateRequest(token_ids=tuple(PROMPT.tolist()),
                              options=GenerateOptions(max_new_tokens=24, temperature=0.0))
    want = host_engine.generate(request).token_ids
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1, device_kv=True))
    assert isinstance(engine.runner, DeviceRunner)
    assert engine.generate(request).token_ids == want
    info = engine.describe()
    assert info["kv_device"] == "cpu" and info["greedy_on_device"] is True


def test_device_kv_counts_in_the_vram_tier_on_cuda(genai_model_dir, monkeypatch):
    """A fake CUDA device: the session is a CPU one, the engine is told it runs on CUDA and
    its runner's KV buffers are device OrtValues (device='cpu' here). KV (runner buffers
    and cached pages) is counted in the VRAM tier, none in host RAM, and the VRAM limit
    binds KV growth."""
    import engine.engine as engine_module
    import engine.memory.governor as governor_module
    from engine.memory.capacity import CapacityProviders, FixedCapacity
    from engine.runtime.providers import SessionInfo

    host = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1))
    vram = FixedCapacity(8 << 30, 0, name="fake GPU")
    monkeypatch.setattr(governor_module, "default_providers", lambda provider, **kw:
                        CapacityProviders(vram=vram, host_ram=FixedCapacity(64 << 30, 0)))
    monkeypatch.setattr(engine_module, "device_options",
                        lambda *a: DeviceOptions("cpu"))
    engine = Engine(host.model, host.tokenizer, host.session, SessionInfo("cuda", 1),
                    host.spec, EngineConfig(intra_op_threads=1, vram_limit="1GiB"))
    assert isinstance(engine.runner, DeviceRunner)
    assert engine.governor.kv_tier == "vram"
    engine.generate(GenerateRequest(token_ids=tuple(PROMPT.tolist()),
                                    options=GenerateOptions(max_new_tokens=8)))
    snap = engine.resource_snapshot()
    assert snap.breakdown.kv_vram_bytes == engine.kv_bytes() >= engine.runner.kv_bytes > 0
    assert snap.breakdown.kv_host_ram_bytes == 0
    assert snap.vram.limit == 1 << 30
    tight = snap.breakdown.weights_bytes + engine.kv_bytes() + 1
    engine.governor.set_limit("vram", f"{tight}B")
    assert not engine.governor.can_allocate("vram", engine.runner.growth_bytes(
        engine.runner.capacity + 1) or 1 << 20)


def test_the_stored_argmax_models_are_what_onnx_helper_builds():
    from onnx import TensorProto, helper

    from engine.runtime.decode_device import argmax_model_bytes

    for dtype, elem in (("float32", TensorProto.FLOAT), ("float16", TensorProto.FLOAT16)):
        graph = helper.make_graph(
            [helper.make_node("ArgMax", ["logits"], ["token"], axis=-1, keepdims=0,
                              select_last_index=0)],
            "greedy_argmax",
            [helper.make_tensor_value_info("logits", elem, ["batch", "seq", "vocab"])],
            [helper.make_tensor_value_info("token", TensorProto.INT64, ["batch", "seq"])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        assert argmax_model_bytes(dtype) == model.SerializeToString()
