"""Ollama's documented requests as its docs send them (curl's ``-d``: no JSON content
type), /api/ps, keep_alive (0 unloads; the next request loads the model again) and the
/api/show fields Continue reads."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.engine.server.live import MODEL_NAME, LiveServer, raw_request, serve

#: Ollama's README/API examples, with the model name of this worker.
EXAMPLES = [
    ("/api/generate", {"model": MODEL_NAME, "prompt": "Why is the sky blue?", "stream": False,
                       "options": {"num_predict": 8}}),
    ("/api/chat", {"model": MODEL_NAME, "stream": False, "options": {"num_predict": 8},
                   "messages": [{"role": "user", "content": "why is the sky blue?"}]}),
    ("/api/show", {"model": MODEL_NAME}),
]
CURL = shutil.which("curl")


def _days_left(iso: str) -> float:
    return (datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() - time.time()) / 86400


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded",
                                          "text/plain"])
@pytest.mark.parametrize("path,body", EXAMPLES, ids=[p for p, _ in EXAMPLES])
def test_bodies_without_a_json_content_type_are_read_as_json(server: LiveServer, path, body,
                                                             content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    status, text = raw_request(server.url, "POST", path, json.dumps(body).encode(), headers)
    assert status == 200, text
    answer = json.loads(text)
    if path == "/api/show":
        assert ".Suffix" in answer["template"]
    else:
        assert answer["done"] is True and 1 <= answer["eval_count"] <= 8  # sampled: EOS may end it


@pytest.mark.skipif(CURL is None, reason="curl is not installed")
def test_the_curl_example_streams_ndjson(server: LiveServer):
    body = json.dumps({"model": MODEL_NAME, "prompt": "Why is the sky blue?",
                       "options": {"num_predict": 6}})
    assert CURL is not None
    out = subprocess.run([CURL, "-sS", f"{server.url}/api/generate", "-d", body],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines[-1]["done"] is True and all(not line["done"] for line in lines[:-1])
    assert 1 <= lines[-1]["eval_count"] <= 6


def test_ps_lists_the_loaded_model_and_when_it_expires(own_server: LiveServer, engine):
    with own_server.client() as http:
        models = http.get("/api/ps").json()["models"]
        assert [m["name"] for m in models] == [MODEL_NAME]
        assert models[0]["context_length"] == engine.context_length
        assert models[0]["size"] > 0 and _days_left(models[0]["expires_at"]) > 365  # for good
        http.post("/api/generate", json={"model": MODEL_NAME, "keep_alive": 1800})  # Continue's
        expires = http.get("/api/ps").json()["models"][0]["expires_at"]
    assert 0 < _days_left(expires) <= 1800 / 86400  # at most 30 minutes from now


def test_show_has_the_fields_continue_reads(server: LiveServer, engine):
    with server.client() as http:
        shown = http.post("/api/show", json={"name": MODEL_NAME}).json()
    arch = shown["model_info"]["general.architecture"]
    assert shown["model_info"][f"{arch}.context_length"] == engine.context_length
    assert shown["details"]["family"] == arch
    assert {"completion", "insert"} <= set(shown["capabilities"])
    # a chat template: tools, in the generic layout (the forge's template has none)
    assert "tools" in shown["capabilities"]
    assert shown["tool_calls"] == {"format": "hermes", "layout": "generic"}


@pytest.fixture
def own_server(model_dir: Path, models_root: Path):
    """A worker of its own: these tests unload its model."""
    live = serve(model_dir, models_root)
    yield live
    live.stop()


def _loaded(http) -> list[str]:
    return [m["name"] for m in http.get("/api/ps").json()["models"]]


def test_keep_alive_zero_unloads_and_the_next_request_loads_again(own_server: LiveServer):
    ask = {"model": MODEL_NAME, "prompt": "def f():", "stream": False, "raw": True,
           "options": {"num_predict": 4, "temperature": 0}}
    with own_server.client() as http:
        first = http.post("/api/generate", json={**ask, "keep_alive": 0}).json()
        assert first["done"] is True and first["eval_count"] == 4
        assert _loaded(http) == [] and http.get("/api/tags").json()["models"] == []
        again = http.post("/api/generate", json=ask).json()  # loads the model again
        assert again["response"] == first["response"] and _loaded(http) == [MODEL_NAME]
        gone = http.post("/api/generate", json={"model": MODEL_NAME, "keep_alive": 0}).json()
        assert gone["done_reason"] == "unload" and _loaded(http) == []
        loaded = http.post("/api/chat", json={"model": MODEL_NAME, "messages": []}).json()
        assert loaded["done_reason"] == "load" and _loaded(http) == [MODEL_NAME]
        streamed = [json.loads(line) for line in http.post(
            "/api/generate", json={**ask, "stream": True, "keep_alive": "0s"}).iter_lines()
            if line.strip()]
        assert streamed[-1]["done"] is True and _loaded(http) == []


def test_a_keep_alive_duration_unloads_after_it(own_server: LiveServer):
    with own_server.client() as http:
        answer = http.post("/api/generate", json={
            "model": MODEL_NAME, "prompt": "x = 1", "raw": True, "stream": False,
            "keep_alive": "1.5s", "options": {"num_predict": 2}}).json()
        assert answer["done"] is True
        expires = http.get("/api/ps").json()["models"][0]["expires_at"]
        assert _days_left(expires) < 1  # a real expiry now
        for _ in range(600):  # the timer fires on the server's own clock
            if not _loaded(http):
                break
            time.sleep(0.1)
        assert _loaded(http) == []


def test_a_bad_keep_alive_is_a_400_that_says_what_to_send(server: LiveServer):
    with server.client() as http:
        response = http.post("/api/generate", json={"model": MODEL_NAME, "prompt": "x",
                                                    "keep_alive": "soon"})
    assert response.status_code == 400
    assert "keep_alive" in response.text and "5m" in response.text
