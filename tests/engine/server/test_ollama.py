"""The Ollama routes as Continue uses them."""

from __future__ import annotations

import json
import re

from engine import GenerateOptions
from tests.engine.server.live import MODEL_NAME

#: Continue's parser of /api/show "parameters" lines.
PARAMETER_LINE = re.compile(r'^(\S+)\s+((?:".*")|\S+)$')


def _lines(response) -> list[dict]:
    return [json.loads(line) for line in response.iter_lines() if line.strip()]


def test_tags_lists_the_loaded_model(server):
    with server.client() as http:
        models = http.get("/api/tags").json()["models"]
    assert [m["name"] for m in models] == [MODEL_NAME]
    assert models[0]["details"]["format"] == "onnx" and models[0]["size"] > 0


def test_show_template_has_suffix_and_says_the_layout(server, nofim_server, engine):
    with server.client() as http:
        shown = http.post("/api/show", json={"name": "qwen2.5-coder:1.5b"}).json()
    assert ".Suffix" in shown["template"] and "<|fim_middle|>" in shown["template"]
    assert "insert" in shown["capabilities"] and shown["fim_layout"] == "psm"
    params: dict[str, list[str]] = {}
    for line in shown["parameters"].split("\n"):
        match = PARAMETER_LINE.match(line)
        assert match, line
        params.setdefault(match[1], []).append(match[2])
    assert params["num_ctx"] == [str(engine.context_length)]
    assert json.loads(params["stop"][0]) == "<|endoftext|>"
    with nofim_server.client() as http:
        plain = http.post("/api/show", json={"model": "plain-chat"}).json()
    # no FIM tokens: the suffix trims a prefix-only answer, and Continue may ask for one
    assert ".Suffix" in plain["template"] and "<|fim" not in plain["template"]
    assert "insert" in plain["capabilities"] and plain["fim_layout"] == "prefix-only"


def test_generate_with_suffix_streams_ndjson_fim(server, engine):
    prefix, suffix = "def area(r):\n    return ", "\n\nprint(area(2))\n"
    with server.client() as http, http.stream("POST", "/api/generate", json={
            "model": "qwen2.5-coder:1.5b", "prompt": prefix, "suffix": suffix, "raw": True,
            "options": {"temperature": 0, "num_predict": 12}}) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = _lines(response)
    assert all(not line["done"] for line in lines[:-1]) and lines[-1]["done"] is True
    text = "".join(line["response"] for line in lines)
    options = GenerateOptions(temperature=0.0, top_k=40, top_p=0.9, max_new_tokens=12)
    assert text == engine.generate(engine.fim_request(prefix, suffix, options)).text
    assert lines[-1]["eval_count"] <= 12 and lines[-1]["prompt_eval_count"] > 0


def test_generate_non_stream_raw_and_templated(server, engine):
    with server.client() as http:
        raw = http.post("/api/generate", json={"model": MODEL_NAME, "prompt": "import os",
                                               "raw": True, "stream": False,
                                               "options": {"num_predict": 5, "seed": 3}})
        chat = http.post("/api/generate", json={"model": MODEL_NAME, "prompt": "hello",
                                                "system": "be brief", "stream": False,
                                                "options": {"num_predict": 5}})
        load = http.post("/api/generate", json={"model": MODEL_NAME})
    assert raw.status_code == chat.status_code == 200
    assert raw.json()["done"] is True
    assert raw.json()["prompt_eval_count"] == len(engine.tokenizer.encode("import os"))
    assert chat.json()["prompt_eval_count"] > raw.json()["prompt_eval_count"]
    assert load.json()["done_reason"] == "load"


def test_chat_streams_messages(server):
    with server.client() as http, http.stream("POST", "/api/chat", json={
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
            "options": {"num_predict": 6}}) as response:
        lines = _lines(response)
    assert lines[-1]["done"] is True
    assert all(line["message"]["role"] == "assistant" for line in lines)


def test_errors_are_ollama_shaped(server, nofim_server):
    with server.client() as http:
        missing = http.post("/api/show", json={"name": "llama3:8b"})
        assert missing.status_code == 404 and isinstance(missing.json()["error"], str)
        bad = http.post("/api/generate", json={"model": MODEL_NAME, "prompt": "x",
                                               "options": {"temperature": "hot"}})
        assert bad.status_code == 400 and "temperature" in bad.json()["error"]
        fmt = http.post("/api/generate", json={"model": MODEL_NAME, "prompt": "x",
                                               "format": "xml"})
        assert fmt.status_code == 400 and "format" in fmt.json()["error"]
    with nofim_server.client() as http:
        nofim = http.post("/api/generate", json={"prompt": "a", "suffix": "b",
                                                 "fim_lines": "sideways"})
        assert nofim.status_code == 400 and "fim_lines" in nofim.json()["error"]
