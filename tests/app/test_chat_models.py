"""The chat header's model picker against a worker of the test's own: the library's
models listed, the loaded one marked, picking another loads it and the chat answers."""

from __future__ import annotations

from app.context import AppContext
from app.store import ChatStore
from app.views.chat_models import LOADED_MARK
from app.views.chat_view import ChatView
from tests.app.conftest import SLOW, TINY, start_worker, stop_worker


def test_the_picker_lists_the_library_marks_the_loaded_model_and_loads_another(
        qtbot, paths, models_root, app_home):
    proc, ready = start_worker(models_root / SLOW, [models_root], app_home)
    try:
        ctx = AppContext(paths)
        ctx.client.configure(ready["url"], None, ready["admin_token"])
        ctx.store = ChatStore(paths.chats_db)
        view = ChatView(ctx)
        qtbot.addWidget(view)
        view.show()
        view.settings.max_tokens.setValue(8)
        with qtbot.waitSignal(ctx.model_changed, timeout=10_000):
            ctx.refresh_model()
        picker = view.model_picker
        qtbot.waitUntil(lambda: len(picker.entries()) == 2, timeout=10_000)
        names = {text.removeprefix(LOADED_MARK): loaded for text, _key, loaded
                 in picker.entries()}
        assert names == {SLOW: True, TINY: False}
        assert picker.currentText() == LOADED_MARK + SLOW
        tiny = next(i for i in range(picker.count()) if picker.itemText(i) == TINY)
        with qtbot.waitSignal(ctx.model_changed, timeout=60_000,
                              check_params_cb=lambda c: bool(c) and TINY in c.get("id", "")):
            picker.setCurrentIndex(tiny)
            picker.activated.emit(tiny)  # what choosing it with the mouse sends
        qtbot.waitUntil(lambda: picker.currentText() == LOADED_MARK + TINY, timeout=10_000)
        assert ctx.settings.last_model == str(models_root / TINY)
        with qtbot.waitSignal(view.answer_finished, timeout=60_000) as done:
            view.send("hello")
        assert done.args[0].state == "done"
        ctx.store.close()
    finally:
        stop_worker(proc)


def test_a_model_loaded_from_outside_the_library_is_the_one_shown(
        qtbot, paths, models_root, app_home, tmp_path):
    import shutil

    outside = shutil.copytree(models_root / TINY, tmp_path / "elsewhere" / "my-own-model")
    proc, ready = start_worker(outside, [models_root], app_home)
    try:
        ctx = AppContext(paths)
        ctx.client.configure(ready["url"], None, ready["admin_token"])
        ctx.store = ChatStore(paths.chats_db)
        view = ChatView(ctx)
        qtbot.addWidget(view)
        with qtbot.waitSignal(ctx.model_changed, timeout=10_000):
            ctx.refresh_model()
        picker = view.model_picker
        qtbot.waitUntil(lambda: len(picker.entries()) == 3, timeout=10_000)
        loaded = [text for text, _key, on in picker.entries() if on]
        assert len(loaded) == 1 and "my-own-model" in loaded[0]
        assert picker.currentText() == loaded[0]  # not a library model in its place
        ctx.store.close()
    finally:
        stop_worker(proc)

