"""The Models view against a real worker of its own (so load / unload do not disturb the
session's shared worker) and downloads from a stand-in hub (``hub_standin``: the real hub
cannot be reached from tests)."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.client import WorkerClient
from app.context import AppContext
from app.paths import AppPaths
from app.views import models_view
from app.views.download_panel import ENDPOINT_KEY
from app.views.models_view import ModelsView
from engine import folder_size, human_size
from engine.hub import PARTIAL_DIR
from tests.app.conftest import TINY, connected, start_worker, stop_worker
from tests.app.hub_standin import HubStandin

REPO = "forge/tiny-onnx"
SUB = "cpu-int4"


@pytest.fixture(scope="module")
def own_worker(models_root: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[str, str]]:
    """A worker with no model loaded and ``models_root`` as its library."""
    home = tmp_path_factory.mktemp("models-view-worker")
    proc, ready = start_worker(None, [models_root], home)
    yield ready["url"], ready["admin_token"]
    stop_worker(proc)


@pytest.fixture(autouse=True)
def no_real_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's own Hugging Face / Foundry caches stay out of the tests."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "no-home"))


@pytest.fixture
def vctx(qtbot, paths: AppPaths, own_worker: tuple[str, str]) -> Iterator[AppContext]:
    yield from connected(qtbot, paths, own_worker)


def make_view(qtbot, ctx: AppContext) -> ModelsView:
    view = ModelsView(ctx)
    qtbot.addWidget(view)
    qtbot.waitUntil(lambda: not view.scanning and view.result is not None, timeout=20_000)
    return view


def copy_model(models_root: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(models_root / TINY, dest)
    return dest


def ask(qtbot, client: WorkerClient, path: str) -> Any:
    reply = client.get(path, admin=True)
    with qtbot.waitSignal(reply.finished, timeout=10_000) as got:
        pass
    return got.args[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the library in the window ----------------------------------------------------------------


def test_add_folder_lists_models_with_their_facts_and_tells_the_worker(
        qtbot, vctx, models_root, tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    copy_model(models_root, lib / "org" / "tiny")
    copy_model(models_root, lib / "a" / "b" / "deep")
    (lib / "linked").symlink_to(copy_model(models_root, tmp_path / "elsewhere" / "real"),
                                target_is_directory=True)
    broken = copy_model(models_root, lib / "org" / "broken")
    with open(broken / "model.onnx.data", "r+b") as f:
        f.truncate(100_000)
    monkeypatch.setattr(models_view, "ask_folder", lambda parent: lib)
    view = make_view(qtbot, vctx)
    with qtbot.waitSignal(view.scanned, timeout=20_000):
        qtbot.mouseClick(view.add_folder_button, models_view.Qt.MouseButton.LeftButton)
    table = view.table
    assert {"org/tiny", "a/b/deep", "linked", "org/broken"} <= {m.name for m in table.models}
    row = table.row_of("org/tiny")
    assert table.cell(row, "Format") == "genai"
    assert table.cell(row, "Size") == human_size(folder_size(lib / "org" / "tiny"))
    assert table.cell(row, "Context") == "256"
    assert table.cell(row, "Quantization") == "fp32"
    assert table.cell(row, "FIM") == "qwen"
    assert table.cell(row, "Chat template") == "yes"
    assert table.cell(row, "Runs on") == "CPU"
    assert table.cell(row, "Status") == "ready"
    status = table.cell(table.row_of("org/broken"), "Status")
    assert status.startswith("incomplete: model.onnx.data is 100.0 kB, expected ")
    table.selectRow(table.row_of("org/broken"))
    assert "Problem: incomplete" in view.details.text()
    assert not view.load_button.isEnabled()
    assert str(lib) in vctx.settings.model_roots
    qtbot.waitUntil(lambda: str(lib.resolve()) in ask(qtbot, vctx.client, "/v1/library")["roots"],
                    timeout=10_000)


def test_a_missing_root_shows_unavailable_and_can_be_removed(qtbot, vctx, tmp_path):
    gone = tmp_path / "unplugged" / "models"
    vctx.settings.set_model_roots([str(gone)])
    view = make_view(qtbot, vctx)
    texts = [view.roots.item(i).text() for i in range(view.roots.count())]
    assert any(str(gone) in t and "unavailable" in t for t in texts)
    assert "1 unavailable" in view.scan_status.text()
    view.roots.setCurrentRow(0)
    assert view.remove_folder_button.isEnabled()
    with qtbot.waitSignal(view.scanned, timeout=20_000):
        view.remove_folder_button.click()
    assert vctx.settings.model_roots == []
    texts = [view.roots.item(i).text() for i in range(view.roots.count())]
    assert not any(str(gone) in t for t in texts)


def test_load_and_unload_through_the_view(qtbot, vctx, models_root, tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "linked-coder").symlink_to(copy_model(models_root, tmp_path / "other" / "coder"),
                                      target_is_directory=True)
    vctx.settings.set_model_roots([str(models_root), str(lib)])
    view = make_view(qtbot, vctx)
    labels: list[str] = []
    vctx.busy.connect(labels.append)
    table = view.table
    table.selectRow(table.row_of(TINY))
    with qtbot.waitSignal(vctx.model_changed, timeout=60_000,
                          check_params_cb=lambda card: card is not None) as changed:
        view.load_button.click()
    assert TINY in changed.args[0]["id"]
    assert labels[0] == f"Loading {TINY}…" and labels[-1] == ""
    row = table.row_of(TINY)
    assert table.cell(row, "Model") == f"● {TINY}"
    assert table.cell(row, "Status") == "loaded"
    name_item = table.item(row, 0)
    assert name_item is not None and name_item.font().bold()
    # a linked model whose folder is outside every root the worker knows
    table.selectRow(table.row_of("linked-coder"))
    with qtbot.waitSignal(vctx.model_changed, timeout=60_000,
                          check_params_cb=lambda card: card is not None) as changed:
        view.load_button.click()
    assert changed.args[0]["meta"]["path"] == str((tmp_path / "other" / "coder").resolve())
    assert table.cell(table.row_of("linked-coder"), "Status") == "loaded"
    assert table.cell(table.row_of(TINY), "Status") == "ready"
    with qtbot.waitSignal(vctx.model_changed, timeout=30_000,
                          check_params_cb=lambda card: card is None):
        view.unload_button.click()
    assert all(not table.cell(r, "Model").startswith("●") for r in range(table.rowCount()))


def test_remove_from_library_hides_and_deletes_only_when_confirmed(
        qtbot, vctx, models_root, tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    model = copy_model(models_root, lib / "spare")
    vctx.settings.set_model_roots([str(lib)])
    view = make_view(qtbot, vctx)
    asked: list[str] = []

    def refuse(parent, text: str) -> bool:
        asked.append(text)
        return False

    monkeypatch.setattr(models_view, "confirm", refuse)
    view.table.selectRow(view.table.row_of("spare"))
    with qtbot.waitSignal(view.scanned, timeout=20_000):
        view.remove_button.click()
    assert view.table.row_of("spare") == -1
    assert model.is_dir() and "delete its files" in asked[0]
    monkeypatch.setattr(models_view, "ask_folder", lambda parent: lib)
    with qtbot.waitSignal(view.scanned, timeout=20_000):
        view.add_folder_button.click()  # adding the folder again shows it again
    assert view.table.row_of("spare") >= 0
    monkeypatch.setattr(models_view, "confirm", lambda parent, text: True)
    view.table.selectRow(view.table.row_of("spare"))
    view.remove_button.click()
    qtbot.waitUntil(lambda: not model.exists(), timeout=20_000)
    qtbot.waitUntil(lambda: not view.scanning and view.table.row_of("spare") == -1,
                    timeout=20_000)


def test_the_built_in_model_cannot_be_removed_from_the_library(qtbot, vctx):
    view = make_view(qtbot, vctx)
    row = view.table.row_of("smollm2-135m-instruct")
    assert row >= 0, "the built-in model is listed"
    view.table.selectRow(row)
    selected = view.selected_model()
    assert selected is not None and selected.source == "builtin"
    assert not view.remove_button.isEnabled()
    assert "comes with the app" in view.remove_button.toolTip()


# --- downloads --------------------------------------------------------------------------------


@pytest.fixture
def hub(models_root: Path, tmp_path: Path) -> Iterator[HubStandin]:
    repo = tmp_path / "hub-repo"
    copy_model(models_root, repo / SUB)
    (repo / "README.md").write_text("# a forged model\n", encoding="utf-8")
    with HubStandin({REPO: repo}) as server:
        yield server


def start_download(view: ModelsView, repo: str, sub: str) -> None:
    view.download.repo_edit.setText(repo)
    view.download.subfolder_edit.setText(sub)
    view.download.start_button.click()


def test_download_shows_progress_and_lands_a_verified_model(qtbot, vctx, hub, models_root):
    vctx.settings.set_value(ENDPOINT_KEY, hub.url)
    hub.chunk, hub.delay_s = 16 * 1024, 0.01
    view = make_view(qtbot, vctx)
    view.show()
    assert not view.download.bar.isVisible()  # no empty box beside Download
    values: list[int] = []
    shown: list[bool] = []
    view.download.bar.valueChanged.connect(values.append)
    view.download.bar.valueChanged.connect(lambda _v: shown.append(
        view.download.bar.isVisible()))
    with qtbot.waitSignal(view.download.ended, timeout=30_000) as ended:
        start_download(view, REPO, SUB)
    assert ended.args[0] == "done", ended.args[1]
    assert len(set(values)) > 2 and values[-1] == 1000
    assert all(shown)  # seen while it runs
    assert not view.download.bar.isVisible()  # and gone once it ended
    target = vctx.paths.models_dir / "forge" / "tiny-onnx" / SUB
    for f in (models_root / TINY).iterdir():
        assert sha256(target / f.name) == sha256(f)
    assert not (target / PARTIAL_DIR).exists()
    assert "verified" in view.download.status.text()
    qtbot.waitUntil(lambda: view.table.row_of(f"{REPO}/{SUB}") >= 0 and not view.scanning,
                    timeout=20_000)
    assert view.table.cell(view.table.row_of(f"{REPO}/{SUB}"), "Status") == "ready"


def test_a_cancelled_download_resumes_where_it_stopped(qtbot, vctx, hub, models_root):
    vctx.settings.set_value(ENDPOINT_KEY, hub.url)
    hub.chunk, hub.delay_s = 8 * 1024, 0.03
    view = make_view(qtbot, vctx)
    start_download(view, REPO, SUB)
    qtbot.waitUntil(lambda: view.download.bar.value() > 200, timeout=30_000)
    with qtbot.waitSignal(view.download.ended, timeout=30_000) as ended:
        view.download.cancel_button.click()
    assert ended.args[0] == "cancelled"
    assert "continue where it stopped" in view.download.status.text()
    target = vctx.paths.models_dir / "forge" / "tiny-onnx" / SUB
    parts = list((target / PARTIAL_DIR).glob("*model.onnx.data*.part"))
    data_size = (models_root / TINY / "model.onnx.data").stat().st_size
    assert len(parts) == 1 and 0 < parts[0].stat().st_size < data_size
    kept = parts[0].stat().st_size
    assert not (target / "model.onnx.data").exists()
    hub.delay_s = 0.0
    values: list[int] = []
    view.download.bar.valueChanged.connect(values.append)
    with qtbot.waitSignal(view.download.ended, timeout=30_000) as ended:
        view.download.start_button.click()
    assert ended.args[0] == "done", ended.args[1]
    assert hub.ranges("model.onnx.data")[-1] == f"bytes={kept}-"
    assert values and values[0] > 200  # the bar starts where it stopped
    assert sha256(target / "model.onnx.data") == sha256(models_root / TINY / "model.onnx.data")


def test_a_missing_repo_is_said_in_words(qtbot, vctx, hub):
    vctx.settings.set_value(ENDPOINT_KEY, hub.url)
    view = make_view(qtbot, vctx)
    notices: list[tuple[str, str]] = []
    vctx.notice.connect(lambda level, text: notices.append((level, text)))
    with qtbot.waitSignal(view.download.ended, timeout=30_000) as ended:
        start_download(view, "forge/no-such-model", "")
    assert ended.args[0] == "failed"
    assert "the repository 'forge/no-such-model' was not found" in ended.args[1]
    assert notices and notices[-1][0] == "error"
    assert view.download.start_button.isEnabled()


def test_the_standin_speaks_huggingface_hubs_own_protocol(hub, tmp_path, models_root):
    """huggingface_hub's own download functions work against the stand-in, so the app's
    downloads are tested against the protocol, not against assumptions of our own."""
    from huggingface_hub import hf_hub_download, snapshot_download

    path = hf_hub_download(REPO, f"{SUB}/model.onnx.data", endpoint=hub.url,
                           local_dir=tmp_path / "one")
    assert sha256(Path(path)) == sha256(models_root / TINY / "model.onnx.data")
    folder = snapshot_download(REPO, endpoint=hub.url, local_dir=tmp_path / "all",
                               allow_patterns=[f"{SUB}/*"])
    assert sorted(p.name for p in (Path(folder) / SUB).iterdir()) == sorted(
        p.name for p in (models_root / TINY).iterdir())
