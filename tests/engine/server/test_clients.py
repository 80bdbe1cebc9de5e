"""Every request body captured from a real editor client (../shared/clients/) gets the
answer that client reads, sent exactly as the client sends it (headers included)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.engine.server.live import LiveServer, llama_vim_accepts, raw_request, sse_events

CLIENTS = Path(__file__).resolve().parents[4] / "shared" / "clients"
FILES = sorted(p.name for p in CLIENTS.glob("*.json")) if CLIENTS.is_dir() else []
SPECIAL = re.compile(r"<\|[a-z_]+\|>")


def _load(name: str) -> dict[str, Any]:
    if not (CLIENTS / name).is_file():
        pytest.skip(f"{CLIENTS} not found")
    return json.loads((CLIENTS / name).read_text(encoding="utf-8"))


def _fill(value: Any) -> Any:
    """Placeholders (``...``) become real code."""
    if isinstance(value, str):
        return value.replace("...", "pass")
    if isinstance(value, list):
        return [_fill(v) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v) for k, v in value.items()}
    return value


@dataclass
class Answer:
    status_code: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


def _send(server: LiveServer, step: dict[str, Any]) -> Answer:
    """The captured request, byte for byte (e.g. llama.vim's ``Authorization: Bearer ``)."""
    headers = dict(step.get("headers", {"Content-Type": "application/json"}))
    body = json.dumps(_fill(step["body"])).encode()
    return Answer(*raw_request(server.url, step["method"], step["path"], body, headers))


def test_every_captured_client_has_a_test():
    assert set(FILES) <= set(CASES), f"untested client captures: {set(FILES) - set(CASES)}"


def _llama_vim_infill(server: LiveServer, capture: dict[str, Any]) -> None:
    response = _send(server, capture)
    assert response.status_code == 200
    assert llama_vim_accepts(response.text)
    answer = response.json()
    for field in capture["body"]["response_fields"]:
        assert field in answer, field
    assert isinstance(answer["content"], str) and answer["timings/prompt_n"] > 0
    again = _send(server, capture).json()  # llama.vim's next keystroke: same context
    # llama.cpp's meaning: prompt_n counts the tokens processed, the rest came from cache
    assert again["tokens_cached"] > answer["tokens_cached"]
    assert again["timings/prompt_n"] < answer["timings/prompt_n"]
    assert again["timings/prompt_n"] + again["tokens_cached"] == \
        answer["timings/prompt_n"] + answer["tokens_cached"]


def _llama_vim_warmup(server: LiveServer, capture: dict[str, Any]) -> None:
    server.wait_idle()
    response = _send(server, capture)
    assert response.status_code == 200
    assert response.json() == {}  # response_fields [""]: nothing, at once
    server.wait_idle()  # the worker evaluated the prompt into the cache meanwhile
    body = {**capture["body"], "n_predict": 2, "response_fields": ["tokens_cached"]}
    warm = _send(server, {**capture, "body": body}).json()
    assert warm["tokens_cached"] > 10  # the extra chunk's KV was ready


def _llama_vscode_infill(server: LiveServer, capture: dict[str, Any]) -> None:
    response = _send(server, capture)
    assert response.status_code == 200
    answers = response.json()
    assert isinstance(answers, list) and len(answers) == capture["body"]["n_cmpl"]
    assert all(isinstance(a["content"], str) for a in answers)


def _continue_raw(server: LiveServer, capture: dict[str, Any]) -> None:
    response = _send(server, capture)
    assert response.status_code == 200
    events = list(sse_events(response.text.splitlines()))
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert not SPECIAL.search(text)
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def _tabby_suffix(server: LiveServer, capture: dict[str, Any]) -> None:
    response = _send(server, capture)
    assert response.status_code == 200
    events = list(sse_events(response.text.splitlines()))
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert not text.endswith(capture["body"]["suffix"])
    assert events[-1] == "[DONE]"


def _tabby_llamacpp(server: LiveServer, capture: dict[str, Any]) -> None:
    response = _send(server, capture)
    assert response.status_code == 200
    events = list(sse_events(response.text.splitlines()))
    assert events and events[-1]["stop"] is True
    assert all(e["stop"] is False and isinstance(e["content"], str) for e in events[:-1])


def _continue_ollama(server: LiveServer, capture: dict[str, Any]) -> None:
    show, generate = capture["steps"]
    shown = _send(server, show).json()
    assert ".Suffix" in shown["template"]
    assert re.search(r"^num_ctx\s+\d+$", shown["parameters"], re.M)
    assert re.search(r'^stop\s+".*"$', shown["parameters"], re.M)
    response = _send(server, generate)
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.text.splitlines() if line]
    assert "error" not in lines[-1] and lines[-1]["done"] is True
    assert all(line["done"] is False and "response" in line for line in lines[:-1])
    text = "".join(line["response"] for line in lines)
    assert "\n\n" not in text  # the client's stop string


CASES = {
    "llama-vim-infill.json": _llama_vim_infill,
    "llama-vim-warmup.json": _llama_vim_warmup,
    "llama-vscode-infill.json": _llama_vscode_infill,
    "continue-raw-completions.json": _continue_raw,
    "tabby-openai-suffix.json": _tabby_suffix,
    "tabby-llamacpp-completion.json": _tabby_llamacpp,
    "continue-ollama.json": _continue_ollama,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_client_capture(server: LiveServer, name: str) -> None:
    CASES[name](server, _load(name))
