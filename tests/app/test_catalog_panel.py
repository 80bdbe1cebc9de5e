"""The Models page's Catalog tab and the welcome's suggestions, offscreen, against a worker
of its own and the Hub stand-in: entries get their fit label from the Hub, **Get** pulls the
best GGUF that fits into the app's model folder with progress, and the worker then serves
it; a model labelled "fits with a shorter context (N tokens)" is served with N."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QTableWidgetItem

from app.context import AppContext
from app.paths import AppPaths
from app.views.catalog_panel import CatalogPanel
from app.views.download_panel import ENDPOINT_KEY
from app.views.models_view import ModelsView
from app.views.welcome import WelcomeDialog
from engine.hub import CatalogEntry
from tests.app.conftest import connected, start_worker, stop_worker
from tests.app.hub_standin import HubStandin
from tests.engine.hub.repos import GGUF_REPO, ONNX_REPO, gguf_repo, onnx_repo
from tests.forge import ForgeSpec

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
        stop_worker(proc)


#: 16 KiB of KV a token: 512 MiB for its 32768-token context, more than the limit below
#: leaves beside the weights (about 16 MiB)
LONG = ForgeSpec(layers=4, hidden=128, heads=8, kv_heads=8, head_dim=64, context=32768,
                 vocab=8192)
#: the context does not fit whole, at float16 KV (8 KiB a token) nor at the int8 KV (4,352
#: bytes a token: 136 MiB) the engine keeps where float16 does not fit
LIMIT = "100MiB"
SHORT_ENTRY = CatalogEntry("long-context", "Long context", "chat", "small", "onnx", ONNX_REPO,
                           "", "", "0.01B", "fp32", 32768, "apache-2.0", None, False, False,
                           "https://huggingface.co/forge/tiny-onnx")


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


def _post(url: str, token: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def _get_in_the_app(qtbot, own: AppContext, hub: HubStandin) -> int:
    """The Catalog tab's label for SHORT_ENTRY under LIMIT, then Get: N of its label."""
    own.settings.set_value(ENDPOINT_KEY, hub.url)
    own.settings.set_value("limits/host_ram", LIMIT)
    panel = CatalogPanel(own, entries=(SHORT_ENTRY,))
    qtbot.addWidget(panel)
    panel.check()
    qtbot.waitUntil(lambda: panel.check_job is None, timeout=60_000)
    label = _cell(panel, 5).text()
    assert label.startswith("fits with a shorter context ("), label
    tokens = int(label.split("(")[1].split()[0])
    assert 1024 <= tokens < 32768
    panel.table.selectRow(0)
    panel.get_button.click()
    qtbot.waitUntil(lambda: panel.status.text().startswith(("Loaded", "Could")) or (
        panel.pull_job is None and not panel.status.text().startswith("Took")),
        timeout=120_000)
    assert panel.status.text().startswith("Loaded"), panel.status.text()
    assert f"with a {tokens}-token context" in panel.status.text()
    return tokens


def test_a_model_labelled_shorter_context_loads_with_that_context_and_answers(
        qtbot, paths: AppPaths, tmp_path: Path, tmp_path_factory) -> None:
    folder = onnx_repo(tmp_path_factory.mktemp("long"), LONG)
    proc, ready = start_worker(None, [paths.models_dir], tmp_path / "worker-home",
                               ["--host-ram-limit", LIMIT])
    try:
        with HubStandin({ONNX_REPO: folder}) as hub:
            for own in connected(qtbot, paths, (ready["url"], ready["admin_token"])):
                tokens = _get_in_the_app(qtbot, own, hub)
        url, token = ready["url"], ready["admin_token"]
        card = _post(url, token, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert card["choices"][0]["message"]["content"] is not None
        with urllib.request.urlopen(url + "/v1/models", timeout=60) as reply:
            [model] = json.loads(reply.read())["data"]
        assert model["meta"]["context_length"] == tokens
        # loaded again from the library (the chat's picker sends the name alone): the
        # context its pull.json recorded
        loaded = _post(url, token, "/v1/models/load", {"model": "long-context"})
        assert loaded["meta"]["context_length"] == tokens
        # the governor admits that context: its KV fits under the limit
        request = urllib.request.Request(url + "/v1/resources",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            resources = json.loads(reply.read())
        assert resources["governor"]["budget"]["kv_tokens"] >= tokens
    finally:
        stop_worker(proc)


CHATS = (CatalogEntry("tiny-chat", "Tiny chat", "chat", "small", "gguf", GGUF_REPO, "",
                      "*.gguf", "0.01B", "best that fits", 256, "apache-2.0", None, False,
                      False, "https://huggingface.co/forge/Tiny-GGUF"),
         CatalogEntry("bigger-chat", "Bigger chat", "chat", "small", "gguf", GGUF_REPO, "",
                      "*.gguf", "0.02B", "best that fits", 256, "apache-2.0", None, False,
                      False, "https://huggingface.co/forge/Tiny-GGUF"))


def test_the_welcome_suggests_the_best_chat_and_code_models_one_click_each(
        qtbot, own: AppContext, hub: HubStandin) -> None:
    own.settings.set_value(ENDPOINT_KEY, hub.url)
    entries = (*CHATS, ENTRY)
    dialog = WelcomeDialog(own, entries=entries)
    panel = CatalogPanel(own, entries=entries)
    qtbot.addWidget(dialog)
    qtbot.addWidget(panel)
    dialog.get_requested.connect(panel.get_entry)
    assert "built-in model is small" in dialog.text.text()  # no other model is loaded
    qtbot.waitUntil(lambda: dialog.check_job is None, timeout=120_000)
    chat, code = dialog.pick_buttons["chat"], dialog.pick_buttons["code"]
    assert not chat.isHidden() and not code.isHidden(), dialog.suggest.text()
    assert chat.text().startswith("Get Bigger chat (0.02B) for chat")  # the larger one
    assert code.text().startswith("Get Tiny coder (0.01B) for code completion")
    assert "fits" in code.text() and "tokens/s" in code.text()
    code.click()
    assert panel.pull_job is not None  # the Catalog tab's own Get
    qtbot.waitUntil(lambda: panel.status.text().startswith(("Loaded", "Could")) or (
        panel.pull_job is None and not panel.status.text().startswith("Took")),
        timeout=120_000)
    assert panel.status.text().startswith("Loaded"), panel.status.text()
    assert [p.name for p in own.paths.models_dir.iterdir()] == ["tiny-coder-q4_k_m"]


def test_the_welcome_offline_says_so_and_keeps_the_built_in_model(qtbot, paths) -> None:
    context = AppContext(paths)
    context.settings.set_value(ENDPOINT_KEY, "http://127.0.0.1:9")  # nothing listens
    try:
        dialog = WelcomeDialog(context, entries=(*CHATS, ENTRY))
        qtbot.addWidget(dialog)
        qtbot.waitUntil(lambda: dialog.check_job is None, timeout=120_000)
        text = dialog.suggest.text()
        assert "could not be reached" in text and "built-in model stays in use" in text
        assert all(b.isHidden() for b in dialog.pick_buttons.values())
    finally:
        context.shutdown()
