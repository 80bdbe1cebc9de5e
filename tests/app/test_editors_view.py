"""Editor set-up against a real worker: the endpoint and settings follow the worker, each
editor's own requests pass, a stopped worker fails with a reason, and the request shapes
embedded in the app match the captures of the editors' source (shared/clients)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.editor_clients import CLIENTS, replay_body
from app.views.editors_view import EditorSetupView

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "clients"


def make_view(qtbot, ctx) -> EditorSetupView:
    view = EditorSetupView(ctx)
    qtbot.addWidget(view)
    view.resize(800, 900)
    view.show()
    return view


def test_endpoint_and_settings_follow_the_worker(qtbot, ctx):
    view = make_view(qtbot, ctx)
    url = ctx.client.base_url
    assert view.endpoint.text() == url
    model = ctx.model["id"]
    for section in view.sections.values():
        assert url in section.settings_box.toPlainText()
        assert section.settings_box.isReadOnly()
    assert model in view.sections["continue"].settings_box.toPlainText()
    assert model in view.sections["tabby"].settings_box.toPlainText()
    assert f"{url}/infill" in view.sections["llama.vim"].settings_box.toPlainText()

    # the worker restarts on another port: everything shown follows
    ctx.client.configure("http://127.0.0.1:18099", None, ctx.client.admin_token)
    assert view.endpoint.text() == "http://127.0.0.1:18099"
    assert all("127.0.0.1:18099" in s.settings_box.toPlainText()
               for s in view.sections.values())
    assert url not in view.sections["tabby"].settings_box.toPlainText()


def test_copy_puts_the_settings_on_the_clipboard(qtbot, ctx):
    view = make_view(qtbot, ctx)
    section = view.sections["llama.vscode"]
    qtbot.mouseClick(section.copy_button, Qt.MouseButton.LeftButton)
    copied = QGuiApplication.clipboard().text()
    assert json.loads(copied) == {"llama-vscode.endpoint": ctx.client.base_url}


@pytest.mark.parametrize("key", [c.key for c in CLIENTS])
def test_each_clients_requests_pass_against_the_worker(qtbot, ctx, key):
    view = make_view(qtbot, ctx)
    section = view.sections[key]
    with qtbot.waitSignal(view.test_finished, timeout=60_000) as done:
        qtbot.mouseClick(section.test_button, Qt.MouseButton.LeftButton)
        assert section.result.text() == "Testing…"
        assert not section.test_button.isEnabled()
    assert done.args[:2] == [key, True], done.args[2]
    assert section.result.text().startswith("✔ Passed")
    assert section.test_button.isEnabled()


def test_a_stopped_worker_fails_with_a_reason(qtbot, ctx):
    view = make_view(qtbot, ctx)
    ctx.client.configure("http://127.0.0.1:9", None, None)  # discard port: nothing listens
    section = view.sections["llama.vim"]
    with qtbot.waitSignal(view.test_finished, timeout=15_000) as done:
        qtbot.mouseClick(section.test_button, Qt.MouseButton.LeftButton)
    key, ok, why = done.args
    assert (key, ok) == ("llama.vim", False)
    assert "POST /infill" in why and "did not answer" in why
    shown = section.result.text()
    assert shown.startswith("✖ Failed") and "did not answer" in shown


def test_replays_name_the_served_model_and_stay_short(ctx):
    tabby = next(c for c in CLIENTS if c.key == "tabby")
    body = replay_body(tabby, tabby.steps[0], "served-model")
    assert body["model"] == "served-model" and body["max_tokens"] <= 16
    vim = next(c for c in CLIENTS if c.key == "llama.vim")
    assert replay_body(vim, vim.steps[1], "served-model")["model"] == ""
    assert replay_body(vim, vim.steps[0], "served-model")["n_predict"] == 0  # warm-up stays


@pytest.mark.skipif(not CAPTURES.is_dir(), reason="no shared/clients captures here")
def test_embedded_request_shapes_match_the_captures():
    for client in CLIENTS:
        for step in client.steps:
            name, index = step.capture
            capture = json.loads((CAPTURES / name).read_text(encoding="utf-8"))
            if index is not None:
                capture = capture["steps"][index]
            where = f"{client.key}: {name}"
            assert (step.method, step.path) == (capture["method"], capture["path"]), where
            assert set(step.body) == set(capture["body"]), where
            assert dict(step.body) == capture["body"], where
