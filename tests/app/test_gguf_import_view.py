"""The Models view's GGUF import: files found in a fake home's Ollama and LM Studio folders,
converted in a child process (``python -m engine import-gguf``) with progress, listed in the
library, loaded by a real worker; a broken file and Cancel leave nothing behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from app.context import AppContext
from app.gguf_sources import find_gguf_files
from app.paths import AppPaths
from app.views import gguf_panel
from app.views.models_view import ModelsView
from tests.app.conftest import connected, start_worker, stop_worker
from tests.engine.model.gguf_forge import TinySpec, tokenizer_source, write_gguf


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-files")
    tok = tokenizer_source(root)
    return {"small": write_gguf(root / "small.gguf", TinySpec("qwen2", QT.Q4_0), tok),
            "big": write_gguf(root / "big.gguf", TinySpec("llama", QT.Q4_K, layers=24,
                                                           hidden=512, head_dim=128, ffn=1024),
                              tok)}


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ggufs: dict[str, Path]) -> Path:
    """A home with one Ollama model (manifest + blob) and one LM Studio file (and a vision
    projector, which is not a model)."""
    home = tmp_path / "user-home"
    models = home / ".ollama" / "models"
    digest = "sha256:" + "ab" * 32
    (models / "blobs").mkdir(parents=True)
    (models / "blobs" / digest.replace(":", "-")).write_bytes(ggufs["small"].read_bytes())
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "tiny-qwen" / "q4"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00"},
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
    studio = home / ".lmstudio" / "models" / "someone" / "tiny-GGUF"
    studio.mkdir(parents=True)
    (studio / "tiny-Q4_K.gguf").write_bytes(ggufs["big"].read_bytes())
    (studio / "mmproj-tiny-f16.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    return home


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    home = tmp_path_factory.mktemp("gguf-worker")
    proc, ready = start_worker(None, [], home)
    yield ready["url"], ready["admin_token"]
    stop_worker(proc)


@pytest.fixture
def vctx(qtbot, paths: AppPaths, worker: tuple[str, str], fake_home: Path
         ) -> Iterator[AppContext]:
    yield from connected(qtbot, paths, worker)


def make_view(qtbot, ctx: AppContext) -> ModelsView:
    view = ModelsView(ctx)
    qtbot.addWidget(view)
    view.show()
    qtbot.waitUntil(lambda: not view.scanning and view.result is not None, timeout=20_000)
    return view


def test_ollama_and_lmstudio_files_are_found_in_their_default_folders(fake_home, tmp_path):
    found = {f.name: f for f in find_gguf_files()}
    assert set(found) == {"tiny-qwen:q4", "someone/tiny-GGUF/tiny-Q4_K.gguf"}
    assert found["tiny-qwen:q4"].source == "Ollama"
    assert found["tiny-qwen:q4"].path.name == "sha256-" + "ab" * 32
    assert found["tiny-qwen:q4"].folder_name == "tiny-qwen-q4"
    assert found["someone/tiny-GGUF/tiny-Q4_K.gguf"].folder_name == "tiny-Q4_K"
    moved = tmp_path / "elsewhere"
    (fake_home / ".ollama" / "models").rename(moved)
    assert "tiny-qwen:q4" not in {f.name for f in find_gguf_files()}
    assert "tiny-qwen:q4" in {f.name for f in find_gguf_files({"OLLAMA_MODELS": str(moved)})}


def test_import_an_ollama_model_then_load_it(qtbot, vctx):
    view = make_view(qtbot, vctx)
    panel = view.gguf
    names = [panel.found.item(i).text() for i in range(panel.found.count())]
    assert any(n.startswith("tiny-qwen:q4 — Ollama") for n in names)
    assert any(n.startswith("someone/tiny-GGUF/tiny-Q4_K.gguf — LM Studio") for n in names)
    panel.found.setCurrentRow(next(i for i, n in enumerate(names) if n.startswith("tiny-qwen")))
    values: list[int] = []
    panel.bar.valueChanged.connect(values.append)
    with qtbot.waitSignal(panel.ended, timeout=120_000) as ended:
        panel.import_button.click()
        assert not panel.import_button.isEnabled() and panel.cancel_button.isEnabled()
    assert ended.args[0] == "done", ended.args[1]
    assert len(set(values)) > 2 and values[-1] == panel.bar.maximum()
    target = vctx.paths.models_dir / "tiny-qwen-q4"
    assert (target / "model.onnx").is_file() and (target / "gguf_import.json").is_file()
    qtbot.waitUntil(lambda: view.table.row_of("tiny-qwen-q4") >= 0 and not view.scanning,
                    timeout=20_000)
    row = view.table.row_of("tiny-qwen-q4")
    assert view.table.cell(row, "Status") == "ready"
    view.table.selectRow(row)
    with qtbot.waitSignal(vctx.model_changed, timeout=60_000,
                          check_params_cb=lambda card: card is not None) as changed:
        view.load_button.click()
    assert changed.args[0]["id"].endswith("tiny-qwen-q4")


def test_a_truncated_file_fails_in_words_and_leaves_nothing(qtbot, vctx, ggufs, tmp_path,
                                                            monkeypatch):
    bad = tmp_path / "half.gguf"
    bad.write_bytes(ggufs["small"].read_bytes()[:5000])
    monkeypatch.setattr(gguf_panel, "ask_gguf_file", lambda parent: bad)
    view = make_view(qtbot, vctx)
    with qtbot.waitSignal(view.gguf.ended, timeout=120_000) as ended:
        view.gguf.pick_button.click()
    assert ended.args[0] == "failed"
    assert "truncated" in ended.args[1] and "download the file again" in ended.args[1]
    models = vctx.paths.models_dir
    assert not models.exists() or not any("half" in p.name for p in models.iterdir())
    assert view.gguf.pick_button.isEnabled()


def test_cancel_stops_the_import_and_removes_its_folder(qtbot, vctx):
    view = make_view(qtbot, vctx)
    panel = view.gguf
    rows = [panel.found.item(i).text() for i in range(panel.found.count())]
    panel.found.setCurrentRow(next(i for i, n in enumerate(rows) if "tiny-Q4_K" in n))

    def cancel_after_the_first_layer(value: int) -> None:
        if value >= 2:
            panel.cancel()

    panel.bar.valueChanged.connect(cancel_after_the_first_layer)
    with qtbot.waitSignal(panel.ended, timeout=120_000) as ended:
        panel.import_button.click()
    assert ended.args[0] == "cancelled"
    models = vctx.paths.models_dir
    assert not any("tiny-Q4_K" in p.name for p in models.iterdir())
    assert panel.import_button.isEnabled() and not panel.cancel_button.isEnabled()
