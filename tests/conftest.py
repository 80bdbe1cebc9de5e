"""Session-wide fixtures: a home folder of the run's own (the user's is never written),
forged model folders (built once per test session) and the shared reference exports."""

from __future__ import annotations

import atexit
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.home_guard import HomeGuard, default_allowed, isolate_home, real_home

# The run's own home, set up at import, before any test module or fixture imports
# platformdirs, Qt or ONNX Runtime, and never undone: HOME, the XDG folders, rustup's,
# Cargo's and the Hugging Face homes point into it for this process and every worker, app or
# pip a test starts (tests/home_guard.py). GUARD records what this process writes under the
# user's real home; each test is failed for its own writes (_home_untouched below).
REAL_HOME = real_home()
_ALLOWED = default_allowed(Path(__file__).resolve().parents[1])  # before HOME moves
SUITE_HOME = isolate_home()
atexit.register(shutil.rmtree, SUITE_HOME, ignore_errors=True)  # however pytest ends
GUARD = HomeGuard(REAL_HOME, [*_ALLOWED, SUITE_HOME])
GUARD.install()

# ONNX Runtime writes its telemetry database under ~/.cache/Microsoft as soon as it is
# imported (tests.forge imports it, at collection, before any fixture runs) and again when
# the process exits: off for the whole run, set before that import and never undone.
os.environ["ORT_DISABLE_TELEMETRY"] = "1"

from tests.forge import (  # noqa: E402
    ForgeSpec,
    make_tokenizer_files,
    write_genai_model,
    write_optimum_model,
    write_static_model,
)

REFERENCE_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "reference-models"


def _home_writes(who: str, writes: list[str]) -> str:
    return (f"{who} wrote under the real home {REAL_HOME} (tests write in their temporary "
            f"folders; the run's home is {SUITE_HOME}):\n" + "\n".join(writes[:40]))


def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp:
        GUARD.allow(Path(config.option.basetemp))


@pytest.fixture(autouse=True)
def _home_untouched() -> Iterator[None]:
    """Fails the test that wrote under the user's real home (this process's writes only:
    another program writing there meanwhile is none of the test's doing)."""
    before = GUARD.take()
    if before:
        pytest.fail(_home_writes("collecting the tests or setting up this test's fixtures",
                                 before), pytrace=False)
    yield
    during = GUARD.take()
    if during:
        pytest.fail(_home_writes("this test", during), pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Writes no test was failed for (a session fixture's teardown, the last test's)."""
    left = GUARD.take()
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(_home_writes("the test run", left), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED



@pytest.fixture(scope="session")
def session_home() -> Path:
    """The run's home folder: HOME and the XDG folders (so platformdirs and Qt) point here in
    this process and in every process a test starts."""
    return SUITE_HOME


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
