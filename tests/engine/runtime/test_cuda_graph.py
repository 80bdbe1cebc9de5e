"""The CUDA graph capture gate (engine.cuda_graph): its decisions and reasons on forged
models, the setting / environment switch, the fallback when ONNX Runtime refuses, and what
describe() and inspect report. No GPU needed: the gate is structural."""

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import InvalidOptionError, ModelLoadError
from engine.runtime import cuda_graph
from engine.runtime.cuda_graph import (
    CUDA_GRAPH_ENV,
    GraphCapture,
    capture_requested,
    decide_capture,
    device_options,
    open_session,
)
from engine.runtime.describe import inspect_model
from engine.runtime.placement import Placement


def _if_model(path: Path) -> Path:
    """A graph whose top level branches on an input: data-dependent control flow."""
    def branch(name: str, value: float) -> onnx.GraphProto:
        const = helper.make_node("Constant", [], [f"{name}_out"],
                                 value=helper.make_tensor("v", TensorProto.FLOAT, [1], [value]))
        return helper.make_graph([const], name, [], [
            helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1])])

    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", 1.0),
                            else_branch=branch("else", 0.0))
    graph = helper.make_graph(
        [node], "if_model", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_top_level_if_is_declined(tmp_path):
    got = decide_capture(True, "cuda", _if_model(tmp_path / "if.onnx"), "shared_buffer")
    assert not got.enabled and got.requested
    assert "has If" in (got.reason or "")


def test_growing_kv_optimum_model_is_declined_for_dynamic_shapes(optimum_model_dir):
    got = decide_capture(True, "cuda", optimum_model_dir / "model.onnx", "growing")
    assert not got.enabled
    assert "dynamic shapes" in (got.reason or "")


@pytest.mark.parametrize("content", [b"", b"\xff\xff\xff not onnx"], ids=["empty", "garbage"])
def test_unreadable_model_is_declined(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    got = decide_capture(True, "cuda", path, "shared_buffer")
    assert not got.enabled
    assert "cannot inspect" in (got.reason or "")


def test_missing_model_is_declined(tmp_path):
    got = decide_capture(True, "cuda", tmp_path / "absent.onnx", "shared_buffer")
    assert "cannot inspect" in (got.reason or "")


def test_genai_gqa_model_is_allowed_on_cuda_only(genai_model_dir):
    model = genai_model_dir / "model.onnx"
    assert decide_capture(True, "cuda", model, "shared_buffer") == GraphCapture(True, True)
    on_cpu = decide_capture(True, "cpu", model, "shared_buffer")
    assert not on_cpu.enabled and on_cpu.reason == "not CUDA (provider cpu)"


def test_not_requested_is_off_without_a_reason(genai_model_dir):
    got = decide_capture(False, "cuda", genai_model_dir / "model.onnx", "shared_buffer")
    assert got == GraphCapture(False, False, None)


def test_setting_wins_over_environment(monkeypatch):
    monkeypatch.setenv(CUDA_GRAPH_ENV, "1")
    assert capture_requested(None) is True
    assert capture_requested(False) is False
    monkeypatch.setenv(CUDA_GRAPH_ENV, "0")
    assert capture_requested(None) is False
    monkeypatch.delenv(CUDA_GRAPH_ENV)
    assert capture_requested(None) is False


def test_invalid_environment_value_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv(CUDA_GRAPH_ENV, "maybe")
    with pytest.raises(InvalidOptionError, match="expected one of 1, true, on"):
        capture_requested(None)


def test_capture_refused_by_ort_falls_back_to_eager_with_the_reason(
        genai_model_dir, monkeypatch):
    """A session ONNX Runtime will not build with capture is rebuilt without it."""
    calls = []

    def fake_make_session(model_file, config, *, provider=None, provider_options=None,
                          graph=None):
        calls.append(dict(provider_options or {}))
        if (provider_options or {}).get("enable_cuda_graph") == "1":
            raise ModelLoadError("all compute graph nodes have not been partitioned")
        return object(), None

    monkeypatch.setattr(cuda_graph, "make_session", fake_make_session)
    config = EngineConfig(cuda_graph=True)
    placement = Placement("cuda", {"gpu_mem_limit": "1024"})
    _, _, capture = open_session(genai_model_dir / "model.onnx", config, placement,
                                 "shared_buffer")
    assert calls == [{"gpu_mem_limit": "1024", "enable_cuda_graph": "1"},
                     {"gpu_mem_limit": "1024"}]
    assert capture.requested and not capture.enabled
    assert "capture failed" in (capture.reason or "")
    assert "partitioned" in (capture.reason or "")


def test_device_options_follow_provider_and_capture():
    on = GraphCapture(True, True)
    assert device_options(None, "cpu", "shared_buffer", on) is None
    cuda = device_options(None, "cuda", "shared_buffer", on)
    assert cuda is not None and cuda.device == "cuda" and cuda.static_shapes and cuda.graph
    assert device_options(None, "cuda", "growing", on) is None
    assert device_options(False, "cuda", "shared_buffer", on) is None
    forced = device_options(True, "cpu", "shared_buffer", GraphCapture(False, False))
    assert forced is not None and forced.device == "cpu" and not forced.graph


def test_engine_on_cpu_reports_capture_declined_as_not_cuda(genai_model_dir):
    engine = Engine.load(genai_model_dir, EngineConfig(intra_op_threads=1, cuda_graph=True,
                                                       provider="cpu"))
    info = engine.describe()["cuda_graph"]
    assert info == {"requested": True, "enabled": False, "reason": "not CUDA (provider cpu)"}


def test_inspect_reports_capture_safety(genai_model_dir, optimum_model_dir):
    assert inspect_model(genai_model_dir)["cuda_graph_safety"] == {"safe": True,
                                                                   "reasons": []}
    optimum = inspect_model(optimum_model_dir)["cuda_graph_safety"]
    assert not optimum["safe"] and "dynamic shapes" in optimum["reasons"][0]
