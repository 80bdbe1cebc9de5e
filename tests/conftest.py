"""Session-wide fixtures: forged model folders (built once per test session) and the
shared reference exports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.forge import (
    ForgeSpec,
    make_tokenizer_files,
    write_genai_model,
    write_optimum_model,
    write_static_model,
)

REFERENCE_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "reference-models"


@pytest.fixture(scope="session")
def forge_spec() -> ForgeSpec:
    """The default tiny spec every session-scoped forged model is built from."""
    return ForgeSpec()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer_files(tmp_path_factory.mktemp("forge-tokenizer"))


@pytest.fixture(scope="session")
def genai_model_dir(tmp_path_factory: pytest.TempPathFactory, forge_spec: ForgeSpec) -> Path:
    return write_genai_model(tmp_path_factory.mktemp("forge-genai"), forge_spec)


@pytest.fixture(scope="session")
def genai_pruned_model_dir(tmp_path_factory: pytest.TempPathFactory, forge_spec: ForgeSpec) -> Path:
    out = tmp_path_factory.mktemp("forge-genai-pruned")
    return write_genai_model(out, forge_spec, prune_lm_head=True)


@pytest.fixture(scope="session")
def optimum_model_dir(tmp_path_factory: pytest.TempPathFactory, forge_spec: ForgeSpec) -> Path:
    return write_optimum_model(tmp_path_factory.mktemp("forge-optimum"), forge_spec)


@pytest.fixture(scope="session")
def static_model_dir(tmp_path_factory: pytest.TempPathFactory, forge_spec: ForgeSpec) -> Path:
    return write_static_model(tmp_path_factory.mktemp("forge-static"), forge_spec)


@pytest.fixture(scope="session")
def reference_models_dir() -> Path:
    """``../shared/reference-models`` (real exports); skips the test when it is absent."""
    if not (REFERENCE_MODELS / "expected-onnxruntime-genai.json").is_file():
        pytest.skip(f"reference models not found at {REFERENCE_MODELS}")
    return REFERENCE_MODELS
