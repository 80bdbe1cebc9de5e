"""The Models page's Catalog tab, offscreen, against a worker of its own and the Hub
stand-in: entries get their fit label from the Hub, **Get** pulls the best GGUF that fits
into the app's model folder with progress, and the worker then serves it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QTableWidgetItem

from app.context import AppContext
from app.paths import AppPaths
from app.views.catalog_panel import CatalogPanel
from app.views.download_panel import ENDPOINT_KEY
from app.views.models_view import ModelsView
from engine.hub import CatalogEntry
from tests.app.conftest import connected, start_worker
from tests.app.hub_standin import HubStandin
from tests.engine.hub.repos import GGUF_REPO, gguf_repo

ENTRY = CatalogEntry("tiny-coder", "Tiny coder", "code", "small", "gguf", GGUF_REPO, "",
                     "*.gguf", "0.01B", "best that fits", 256, "apache-2.0", "qwen", False,
                     False, "https://huggingface.co/forge/Tiny-GGUF")


@pytest.fixture
def hub(tmp_path_factory) -> Iterator[HubStandin]:
    with HubStandin({GGUF_REPO: gguf_repo(tmp_path_factory.mktemp("repos"))}) as standin:
        yield standin


@pytest.fixture
def own(qtbot, paths: AppPaths, tmp_path: Path) -> Iterator[AppContext]:
    """A worker whose library is the app's model folder, and a context talking to it."""
    proc, ready = start_worker(None, [paths.models_dir], tmp_path / "worker-home")
    try:
        yield from connected(qtbot, paths, (ready["url"], ready["admin_token"]))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _cell(panel: CatalogPanel, column: int) -> QTableWidgetItem:
    item = panel.table.item(0, column)
    assert item is not None
    return item


def test_catalog_tab_labels_gets_and_loads_a_model(qtbot, own: AppContext,
                                                   hub: HubStandin) -> None:
    own.settings.set_value(ENDPOINT_KEY, hub.url)
    panel = CatalogPanel(own, entries=(ENTRY,))
    qtbot.addWidget(panel)
    assert _cell(panel, 5).text() == "not checked yet"  # nothing read before asked
    panel.check()
    qtbot.waitUntil(lambda: panel.check_job is None, timeout=60_000)
    assert _cell(panel, 3).text() == "Q4_K_M"
    assert _cell(panel, 5).text().startswith("fits")
    assert "weights" in _cell(panel, 5).toolTip()
    panel.table.selectRow(0)
    assert "apache-2.0" in panel.details.text() and "KV" in panel.details.text()
    assert panel.get_button.isEnabled()
    panel.get_button.click()
    qtbot.waitUntil(lambda: panel.status.text().startswith(("Loaded", "Could")) or (
        panel.pull_job is None and not panel.status.text().startswith("Took")),
        timeout=120_000)
    assert panel.status.text().startswith("Loaded"), panel.status.text()
    assert (own.paths.models_dir / "tiny-coder-q4_k_m").is_dir()
    assert panel.bar.value() == 1000
    assert [p.name for p in own.paths.models_dir.iterdir()] == ["tiny-coder-q4_k_m"]
    qtbot.waitUntil(lambda: own.model is not None and "tiny-coder" in str(own.model.get("id")),
                    timeout=30_000)


def test_the_models_page_has_a_catalog_tab(qtbot, own: AppContext) -> None:
    view = ModelsView(own)
    qtbot.addWidget(view)
    assert [view.tabs.tabText(i) for i in range(view.tabs.count())] == ["Library", "Catalog"]
    assert view.catalog.table.rowCount() >= 10  # the shipped catalog


def test_hub_search_adds_labelled_rows_for_what_the_catalog_lacks(
        qtbot, own: AppContext, hub: HubStandin) -> None:
    own.settings.set_value(ENDPOINT_KEY, hub.url)
    panel = CatalogPanel(own, entries=(ENTRY,))
    qtbot.addWidget(panel)
    panel.query.setText("tiny")
    panel.search_button.click()
    qtbot.waitUntil(lambda: panel.check_job is None, timeout=60_000)
    assert panel.table.rowCount() == 2
    found = panel.table.item(1, 0)
    assert found is not None and found.text() == GGUF_REPO
    label = panel.table.item(1, 5)
    assert label is not None and label.text().startswith("fits")
