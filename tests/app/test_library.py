"""The model library without the window: where models are found (any depth, links, link
cycles, missing roots, the known caches), what is read from them, and the completeness
check. Models are forged copies of ``qwen-coder-tiny``; nothing is loaded or run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.library import (
    LibraryRoot,
    huggingface_cache,
    human_size,
    library_roots,
    scan_library,
    where_it_runs,
)
from engine import completeness_problem, folder_size
from engine.hub import DownloadError, check_space
from tests.app.conftest import TINY


@pytest.fixture(autouse=True)
def no_real_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's own Hugging Face / Foundry caches stay out of the tests."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "no-home"))


def _copy(models_root: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(models_root / TINY, dest)
    return dest


@pytest.fixture(scope="module")
def tree(models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lib/org/tiny, lib/x/y/deep, lib/linked -> outside/real, lib/loop -> lib (a cycle),
    lib/org/broken (model.onnx.data truncated), lib/org/nodata (model.onnx.data gone)."""
    base = tmp_path_factory.mktemp("library")
    lib = base / "lib"
    _copy(models_root, lib / "org" / "tiny")
    _copy(models_root, lib / "x" / "y" / "deep")
    (lib / "linked").symlink_to(_copy(models_root, base / "outside" / "real"),
                                target_is_directory=True)
    (lib / "x" / "loop").symlink_to(lib, target_is_directory=True)
    broken = _copy(models_root, lib / "org" / "broken")
    with open(broken / "model.onnx.data", "r+b") as f:
        f.truncate(200_000)
    (_copy(models_root, lib / "org" / "nodata") / "model.onnx.data").unlink()
    return lib


def _root(path: Path, kind: str = "folder") -> LibraryRoot:
    return LibraryRoot(path, kind, str(path))


def test_nested_and_linked_models_are_found_once_and_a_link_cycle_ends(tree):
    result = scan_library([_root(tree)])
    names = [m.name for m in result.models]
    assert sorted(names) == ["linked", "org/broken", "org/nodata", "org/tiny", "x/y/deep"]
    assert result.roots[0].available and result.roots[0].note == "5 models"


def test_a_model_shows_format_size_context_quantization_fim_and_template(tree, models_root):
    model = next(m for m in scan_library([_root(tree)]).models if m.name == "org/tiny")
    assert model.format == "genai"
    assert model.size_bytes == folder_size(models_root / TINY) > 500_000
    assert model.context_length == 256
    assert model.quantization == "fp32"
    assert model.fim == "qwen"
    assert model.chat_template is True
    assert model.complete and model.problem is None


def test_a_truncated_or_missing_data_file_is_flagged_with_sizes(tree):
    models = {m.name: m for m in scan_library([_root(tree)]).models}
    expected = human_size((tree / "org" / "tiny" / "model.onnx.data").stat().st_size)
    assert models["org/broken"].problem == (
        f"incomplete: model.onnx.data is 200.0 kB, expected {expected}")
    assert models["org/nodata"].problem == (
        f"incomplete: model.onnx.data is missing (expected {expected})")
    assert models["org/broken"].context_length == 256  # still read from genai_config.json
    assert completeness_problem(tree / "org" / "tiny") is None


def test_a_missing_root_is_unavailable_not_an_error(tmp_path):
    gone = tmp_path / "unplugged-drive" / "models"
    result = scan_library([_root(gone)])
    assert result.models == ()
    assert not result.roots[0].available
    assert result.roots[0].note.startswith("unavailable:")


def test_hf_cache_and_foundry_cache_are_known_locations(models_root, tmp_path, monkeypatch):
    hub = tmp_path / "hf" / "hub"
    snapshot = hub / "models--forge--tiny-onnx" / "snapshots" / ("a" * 40) / "cpu-int4"
    _copy(models_root, snapshot)
    (hub / ".locks").mkdir()
    home = tmp_path / "home"
    _copy(models_root, home / ".foundry" / "cache" / "models" / "Microsoft" / "tiny-cpu")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HOME", str(home))
    downloads = tmp_path / "downloads"  # not there yet: not listed
    roots = library_roots([], downloads)
    # (plus the built-in models of this tree, when it has them)
    assert [r.kind for r in roots if r.kind != "builtin"] == ["huggingface", "foundry"]
    names = {m.name: m.source for m in scan_library(roots).models if m.source != "builtin"}
    assert names == {"forge/tiny-onnx/cpu-int4": "huggingface",
                     "Microsoft/tiny-cpu": "foundry"}
    assert huggingface_cache({"HF_HUB_CACHE": "/x/cache"}) == Path("/x/cache")
    assert huggingface_cache({"HF_HOME": "/x/home"}) == Path("/x/home/hub")


def test_user_roots_are_listed_even_when_missing_and_without_duplicates(tmp_path):
    (tmp_path / "a").mkdir()
    roots = library_roots([str(tmp_path / "a"), str(tmp_path / "a"), str(tmp_path / "gone")],
                          tmp_path / "a")
    assert [(r.path.name, r.kind) for r in roots if r.kind != "builtin"] == [
        ("a", "folder"), ("gone", "folder")]


def test_where_it_runs_says_cpu_without_a_gpu_runtime(tree):
    model = next(m for m in scan_library([_root(tree)]).models if m.name == "org/tiny")
    assert where_it_runs(model, loaded_provider=None, gpu_runtime=False, resources=None) == "CPU"
    assert where_it_runs(model, loaded_provider="cpu", gpu_runtime=True, resources=None) == "CPU"
    # A GPU cannot exist here: these /v1/resources figures are written by hand.
    small_gpu = {"governor": {"vram": {"capacity": 8 << 30, "limit": 1000}}}
    assert where_it_runs(model, loaded_provider=None, gpu_runtime=True,
                         resources=small_gpu).startswith("CPU (over the 1.0 kB VRAM limit")
    big_gpu = {"governor": {"vram": {"capacity": 8 << 30, "limit": 4 << 30}}}
    assert where_it_runs(model, loaded_provider=None, gpu_runtime=True,
                         resources=big_gpu) == "GPU"


def test_a_download_larger_than_the_free_space_is_refused_in_words(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(DownloadError, match=r"^disk full: the download needs"):
        check_space(tmp_path / "not-yet" / "there", free + 10**12)
    check_space(tmp_path, 1)  # a byte fits
