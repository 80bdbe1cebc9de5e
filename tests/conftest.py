"""Session-wide fixtures: a home folder of the session's own (the user's is never written),
forged model folders (built once per test session) and the shared reference exports."""

from __future__ import annotations

import os
from collections.abc import Iterator
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

#: Folders under the user's home that this project or its libraries write to, when pointed
#: there: the app's platformdirs, ONNX Runtime's telemetry, the Hugging Face cache.
WATCHED = (".cache/onnx-local-llm", ".config/onnx-local-llm", ".local/share/onnx-local-llm",
           ".local/state/onnx-local-llm", ".cache/Microsoft", ".cache/huggingface",
           ".config/matplotlib", ".cache/matplotlib")
#: Folders whose direct entries are watched (something new appearing in them).
LISTED = (".", ".cache", ".config", ".local", ".local/share", ".local/state")
#: Environment variables that decide where programs write user files.
HOME_VARIABLES = ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
                  "XDG_STATE_HOME", "XDG_RUNTIME_DIR")


def home_snapshot(home: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under WATCHED (modified time, size) and the entries of LISTED
    folders: what a test could change in ``home``."""
    seen: dict[str, tuple[int, int]] = {}
    for folder in LISTED:
        try:
            for entry in os.scandir(home / folder):
                seen.setdefault(os.path.normpath(f"{folder}/{entry.name}"), (0, 0))
        except OSError:
            continue
    for folder in WATCHED:
        for root, dirs, files in os.walk(home / folder):
            for name in dirs + files:
                path = Path(root, name)
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
    inherit the environment). ONNX Runtime's telemetry is off. At the end the session fails
    if anything under the user's real home changed."""
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
        patch.setenv("ORT_DISABLE_TELEMETRY", "1")
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


@pytest.fixture(scope="session")
def reference_models_dir() -> Path:
    """``../shared/reference-models`` (real exports); skips the test when it is absent."""
    if not (REFERENCE_MODELS / "expected-onnxruntime-genai.json").is_file():
        pytest.skip(f"reference models not found at {REFERENCE_MODELS}")
    return REFERENCE_MODELS
