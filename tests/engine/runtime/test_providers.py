import pytest

from engine.config import EngineConfig
from engine.errors import RuntimeSelectionError
from engine.runtime.providers import (
    check_ort_installation,
    choose_providers,
    installed_ort_variants,
    provider_from_env,
)


def test_exactly_one_ort_variant_is_installed_here():
    assert check_ort_installation() in installed_ort_variants()


def test_two_variants_are_refused_with_the_uninstall_command():
    with pytest.raises(RuntimeSelectionError) as err:
        check_ort_installation(["onnxruntime", "onnxruntime-gpu"])
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in str(err.value)


def test_missing_ort_says_which_extra_to_install():
    with pytest.raises(RuntimeSelectionError, match=r"\.\[cpu\]"):
        check_ort_installation([])


def test_auto_prefers_cuda_then_directml_then_cpu():
    assert choose_providers("auto", ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert choose_providers("auto", cuda)[0] == "CUDAExecutionProvider"
    dml = ["DmlExecutionProvider", "CPUExecutionProvider"]
    assert choose_providers("auto", dml)[0] == "DmlExecutionProvider"


def test_unavailable_provider_is_an_error_not_a_silent_cpu_fallback():
    with pytest.raises(RuntimeSelectionError, match="'cuda' extra"):
        choose_providers("cuda", ["CPUExecutionProvider"])


def test_backend_env_is_case_insensitive_and_rejects_unknown(monkeypatch):
    monkeypatch.setenv("ONNX_GENAI_BACKEND", "CPU")
    assert provider_from_env("auto") == "cpu"
    assert provider_from_env("cuda") == "cuda"  # an explicit setting wins over the env
    monkeypatch.setenv("ONNX_GENAI_BACKEND", "tpu")
    with pytest.raises(RuntimeSelectionError, match="auto, cpu, cuda, directml"):
        provider_from_env("auto")


def test_engine_config_rejects_unknown_provider():
    with pytest.raises(ValueError, match="provider"):
        EngineConfig(provider="metal")
