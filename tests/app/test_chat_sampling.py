"""A new chat starts from the loaded model's recommended sampling (its generation_config.json
or the user's preset, as the worker's model card says)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.settings import CHAT_SAMPLING
from app.store import ChatStore
from app.views.chat_view import ChatView
from tests.app.conftest import TINY, connected, start_worker, stop_worker


@pytest.fixture
def recommending_worker(models_root: Path, tmp_path: Path):
    folder = tmp_path / "models" / "recommending-coder"
    shutil.copytree(models_root / TINY, folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.35, "top_p": 0.8, "repetition_penalty": 1.15}), encoding="utf-8")
    presets = tmp_path / "presets.json"
    presets.write_text(json.dumps({"recommending-coder": {"num_predict": 96}}), encoding="utf-8")
    proc, ready = start_worker(folder, [folder.parent], tmp_path,
                               ["--presets", str(presets)])
    yield ready["url"], ready["admin_token"]
    stop_worker(proc)


def test_a_new_chat_starts_from_the_models_recommended_sampling(qtbot, paths,
                                                                recommending_worker):
    for ctx in connected(qtbot, paths, recommending_worker):
        assert ctx.model is not None
        sampling = ctx.model["meta"]["sampling"]
        assert sampling["temperature"] == {"value": 0.35, "source": "generation_config.json"}
        ctx.store = ChatStore(paths.chats_db)
        view = ChatView(ctx)
        qtbot.addWidget(view)
        conv = view.new_conversation()
        assert view.settings.sampling() == {"temperature": 0.35, "top_p": 0.8,
                                            "repetition_penalty": 1.15, "max_tokens": 96}
        saved = view.store.conversation(conv)
        assert saved is not None and saved.sampling["temperature"] == 0.35


def test_without_recommendations_a_chat_keeps_the_apps_defaults(qtbot, ctx, paths):
    """The test model has no generation_config.json: the dialect's defaults the card
    reports are the server's, not the model's, and do not replace the app's."""
    ctx.store = ChatStore(paths.chats_db)
    view = ChatView(ctx)
    qtbot.addWidget(view)
    view.new_conversation()
    assert view.settings.sampling() == CHAT_SAMPLING
