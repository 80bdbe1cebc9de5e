"""Session-wide fixtures: a home folder of the session's own (the user's is never written),
forged model folders (built once per test session) and the shared reference exports."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# ONNX Runtime writes its telemetry database under ~/.cache/Microsoft as soon as it is
# imported (tests.forge imports it, at collection, before any fixture runs) and again when
# the process exits: off for the whole run, set before that import and never undone.
os.environ["ORT_DISABLE_TELEMETRY"] = "1"

from tests.forge import (
    ForgeSpec,
    make_tokenizer_files,
    write_genai_model,
    write_optimum_model,
    write_static_model,
)

REFERENCE_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "reference-models"

#: The folders under the user's home that this project's code writes to when pointed there
#: (the app's and the worker's platformdirs: chats, settings, admin token, KV store). Other
#: libraries' folders (ONNX Runtime's telemetry under .cache/Microsoft, the Hugging Face
#: cache) are not watched: other programs on the machine write there too, and the
#: session's HOME and ORT_DISABLE_TELEMETRY keep the tests out of them (tests/test_home.py).
WATCHED = (".cache/onnx-local-llm", ".config/onnx-local-llm", ".local/share/onnx-local-llm",
           ".local/state/onnx-local-llm")


def home_snapshot(home: Path) -> dict[str, tuple[int, int]]:
    """Each WATCHED folder and everything under it (modified time, size): what a test
    could change in ``home``."""
    seen: dict[str, tuple[int, int]] = {}
    for folder in WATCHED:
        for root, dirs, files in os.walk(home / folder):
            for path in (Path(root), *(Path(root, name) for name in dirs + files)):
                try:
                    info = path.lstat()
                except OSError:
                    continue
                seen[str(path.relative_to(home))] = (info.st_mtime_ns, info.st_size)
    return seen


def home_changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
                 ) -> list[str]:
    """What differs between two snapshots, one line a path."""
    changed = []
    for path in sorted(set(before) | set(after)):
        if path not in before:
            changed.append(f"+ {path}")
        elif path not in after:
            changed.append(f"- {path}")
        elif before[path] != after[path]:
            changed.append(f"~ {path}")
    return changed


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HOME and the XDG folders (so platformdirs too) point at a temporary folder for the
    whole session, in this process and in every worker or app process a test starts (they
    inherit the environment; ONNX Runtime's telemetry is off from the import above). At the
    end the session fails if anything under the user's real home changed."""
    real = Path(os.environ.get("HOME") or Path.home())
    before = home_snapshot(real)
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        for variable, folder in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"),
                                 ("XDG_DATA_HOME", ".local/share"),
                                 ("XDG_STATE_HOME", ".local/state"),
                                 ("XDG_RUNTIME_DIR", "runtime")):
            (home / folder).mkdir(parents=True, mode=0o700)
            patch.setenv(variable, str(home / folder))
        patch.delenv("ONNX_LOCAL_LLM_HOME", raising=False)
        yield home
    changed = home_changes(before, home_snapshot(real))
    if changed:
        pytest.fail(f"the tests wrote under the real home {real} (+ new, ~ changed, "
                    f"- removed):\n" + "\n".join(changed[:40]), pytrace=False)


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


#: A forged model big enough for int4 rounding to depend on how many rows a step has
#: (128-row quantization blocks): its batched and verified steps move log-probabilities a
#: little, which the 64-wide default model does not show (tests/engine/equivalence.py).
INT4_SPEC = ForgeSpec(hidden=256, intermediate=768, layers=4, heads=8, kv_heads=2, vocab=2048)


@pytest.fixture(scope="session")
def int4_fp32_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """INT4_SPEC in fp32: the weights int4_model_dir quantizes."""
    return write_genai_model(tmp_path_factory.mktemp("forge-int4-fp32"), INT4_SPEC)


@pytest.fixture(scope="session")
def int4_model_dir(tmp_path_factory: pytest.TempPathFactory, int4_fp32_model_dir: Path
                   ) -> Path:
    """INT4_SPEC with every weight MatMul in int4 (MatMulNBits, blocks of 128)."""
    from tests.forge import quantize_int4

    return quantize_int4(int4_fp32_model_dir, tmp_path_factory.mktemp("forge-int4"),
                         block_size=128)


@pytest.fixture(scope="session")
def reference_models_dir() -> Path:
    """``../shared/reference-models`` (real exports); skips the test when it is absent."""
    if not (REFERENCE_MODELS / "expected-onnxruntime-genai.json").is_file():
        pytest.skip(f"reference models not found at {REFERENCE_MODELS}")
    return REFERENCE_MODELS
