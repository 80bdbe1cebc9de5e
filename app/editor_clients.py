"""Code editors that can use the worker: what each one sends, what it needs back, and the
settings that point it here.

The request shapes are the editors' own (captured from their source; the test suite checks
them against the captures in ``shared/clients`` when that folder exists). They live here,
in the app, because an installed app has no such folder. :class:`ClientTest` replays a
client's requests against the worker and says in words whether it would work.

Chosen set-ups (each works with any FIM model the worker serves, because the worker, not
the editor, lays out the FIM prompt):

- llama.vscode and llama.vim: llama.cpp's ``POST /infill``.
- Continue: its ``ollama`` provider (``/api/show``, then ``/api/generate`` with ``suffix``);
  Continue turns autocomplete on only when the template from ``/api/show`` has ``.Suffix``.
- Tabby: ``kind = "openai/completion"`` (``/v1/completions`` with ``suffix``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.client import ApiFailure, JsonReply, SseStream, WorkerClient, single_shot

#: Replays ask for this many tokens at most (the shape stays the editor's; the test is quick).
REPLAY_TOKENS = 16
REPLAY_TIMEOUT_MS = 60_000

Check = Callable[[list[Any]], str | None]  # the answers → None (pass) or why it fails


@dataclass(frozen=True)
class ClientStep:
    """One request an editor sends, and how it reads the answer."""

    method: str
    path: str
    body: Mapping[str, Any]
    reads: str  # "json" | "sse" | "ndjson"
    expect: str  # what a passing answer looks like, in words
    check: Check
    #: The capture this mirrors in shared/clients: (file, step index or None).
    capture: tuple[str, int | None]


@dataclass(frozen=True)
class EditorClient:
    key: str
    name: str
    where: str  # where the settings go
    steps: tuple[ClientStep, ...]
    #: The body's "model" must name the served model (Continue, Tabby send what you set).
    names_model: bool
    settings: Callable[[str, str, str], str]  # (endpoint, model id, api key) → text


# --- what a passing answer looks like --------------------------------------------------------


def _has_content(answers: list[Any]) -> str | None:
    body = answers[0] if answers else None
    items = body if isinstance(body, list) else [body]
    if not items or not all(isinstance(i, dict) and isinstance(i.get("content"), str)
                            for i in items):
        return "the answer has no \"content\" text"
    return None


def _vim_infill(answers: list[Any]) -> str | None:
    missing = _has_content(answers)
    if missing:
        return missing
    if "timings/prompt_n" not in answers[0]:
        return "the answer lacks \"timings/prompt_n\" (response_fields were not honoured)"
    return None


def _warmup(answers: list[Any]) -> str | None:
    return None if answers and isinstance(answers[0], dict) else "the answer is not an object"


def _fim_template(answers: list[Any]) -> str | None:
    body = answers[0] if answers and isinstance(answers[0], dict) else {}
    if ".Suffix" not in str(body.get("template", "")):
        return ("the model's template has no .Suffix: Continue would turn autocomplete off "
                "(load a model with FIM tokens)")
    return None


def _ndjson_text(answers: list[Any]) -> str | None:
    if not answers or answers[-1].get("done") is not True:
        return "the stream did not end with a \"done\": true line"
    if not any(isinstance(a.get("response"), str) for a in answers):
        return "no line carried \"response\" text"
    return None


def _sse_text(answers: list[Any]) -> str | None:
    texts = [c.get("text") for a in answers if isinstance(a, dict)
             for c in a.get("choices") or () if isinstance(c, dict)]
    if not texts or not all(isinstance(t, str) for t in texts):
        return "no event carried choices[0].text"
    if "".join(str(t) for t in texts).endswith(str(TABBY_STEP_BODY["suffix"]).rstrip()):
        return "the suffix came back in the text: the server appended it"
    return None


# --- the request shapes (see shared/clients/README.md) ----------------------------------------

LLAMA_VSCODE_BODY: dict[str, Any] = {
    "input_prefix": "function add(a, b) {\n", "input_suffix": "\n}\n",
    "input_extra": [{"text": "export const PI = 3.14;\n", "time": 1764400002,
                     "filename": "src/math.js"}],
    "prompt": "  return ", "n_predict": 128, "top_k": 40, "top_p": 0.99, "stream": False,
    "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
    "t_max_predict_ms": 500, "n_cmpl": 3}

LLAMA_VIM_WARMUP_BODY: dict[str, Any] = {
    "id_slot": 0, "input_prefix": "", "input_suffix": "",
    "input_extra": [{"text": "class Config:\n    debug = False\n", "time": 1764400001,
                     "filename": "src/config.py"}],
    "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
    "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}

LLAMA_VIM_BODY: dict[str, Any] = {
    "id_slot": 0, "input_prefix": "import os\n\ndef list_py_files(root):\n",
    "input_suffix": "\n    return result\n",
    "input_extra": [{"text": "def helper():\n    pass\n", "time": 1764400000,
                     "filename": "src/util.py"}],
    "prompt": "    result = [", "n_predict": 128, "stop": [], "n_indent": 4, "top_k": 40,
    "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"], "stream": False,
    "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 250,
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms",
                        "timings/prompt_per_token_ms", "timings/prompt_per_second",
                        "timings/predicted_n", "timings/predicted_ms",
                        "timings/predicted_per_token_ms", "timings/predicted_per_second",
                        "truncated", "tokens_cached"],
    "model": ""}

CONTINUE_SHOW_BODY: dict[str, Any] = {"name": "qwen2.5-coder:1.5b"}

CONTINUE_GENERATE_BODY: dict[str, Any] = {
    "model": "qwen2.5-coder:1.5b", "prompt": "def area(r):\n    return ",
    "suffix": "\n\nprint(area(2))\n", "raw": True,
    "options": {"temperature": 0.01, "top_p": 1.0, "num_predict": 256, "stop": ["\n\n"],
                "num_ctx": 4096},
    "keep_alive": 1800, "stream": True}

TABBY_STEP_BODY: dict[str, Any] = {
    "model": "qwen2.5-coder-1.5b", "prompt": "def area(r):\n    return ",
    "suffix": "\n\nprint(area(2))\n", "max_tokens": 64, "temperature": 0.1, "stream": True}


# --- ready-to-paste settings -------------------------------------------------------------------


def _vscode_settings(endpoint: str, model: str, key: str) -> str:
    lines = [f'  "llama-vscode.endpoint": {json.dumps(endpoint)}']
    if key:
        lines.append(f'  "llama-vscode.api_key": {json.dumps(key)}')
    return "{\n" + ",\n".join(lines) + "\n}"


def _vim_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _vim_settings(endpoint: str, model: str, key: str) -> str:
    entries = [f"'endpoint_fim': {_vim_string(endpoint + '/infill')}"]
    if key:
        entries.append(f"'api_key': {_vim_string(key)}")
    body = "".join(f"    \\ {e},\n" for e in entries)
    return ("\" older llama.vim versions read 'endpoint' instead of 'endpoint_fim'\n"
            f"let g:llama_config = {{\n{body}    \\ }}")


def _continue_settings(endpoint: str, model: str, key: str) -> str:
    lines = ["# already have a config.yaml? add the entry under models: to yours",
             "name: Local assistant", "version: 1.0.0", "schema: v1", "models:",
             "  - name: Local FIM (this app)", "    provider: ollama",
             f"    model: {json.dumps(model)}", f"    apiBase: {json.dumps(endpoint)}"]
    if key:
        lines.append(f"    apiKey: {json.dumps(key)}")
    lines += ["    roles:", "      - autocomplete"]
    return "\n".join(lines)


def _tabby_settings(endpoint: str, model: str, key: str) -> str:
    lines = ["[model.completion.http]", 'kind = "openai/completion"',
             f"model_name = {json.dumps(model)}", f"api_endpoint = {json.dumps(endpoint + '/v1')}"]
    if key:
        lines.append(f"api_key = {json.dumps(key)}")
    return "\n".join(lines)


CLIENTS: tuple[EditorClient, ...] = (
    EditorClient(
        "llama.vscode", "llama.vscode (VS Code)", "VS Code settings.json",
        (ClientStep("POST", "/infill", LLAMA_VSCODE_BODY, "json",
                    "an object with \"content\", or a list of them (n_cmpl 3)", _has_content,
                    ("llama-vscode-infill.json", None)),),
        False, _vscode_settings),
    EditorClient(
        "llama.vim", "llama.vim (Vim, Neovim)", "your vimrc (or init.vim)",
        (ClientStep("POST", "/infill", LLAMA_VIM_WARMUP_BODY, "json",
                    "an object at once (the cache warm-up)", _warmup,
                    ("llama-vim-warmup.json", None)),
         ClientStep("POST", "/infill", LLAMA_VIM_BODY, "json",
                    "\"content\" and the \"timings/...\" fields it asked for", _vim_infill,
                    ("llama-vim-infill.json", None))),
        False, _vim_settings),
    EditorClient(
        "continue", "Continue (VS Code, JetBrains)", "~/.continue/config.yaml",
        (ClientStep("POST", "/api/show", CONTINUE_SHOW_BODY, "json",
                    "a template that mentions .Suffix", _fim_template,
                    ("continue-ollama.json", 0)),
         ClientStep("POST", "/api/generate", CONTINUE_GENERATE_BODY, "ndjson",
                    "NDJSON lines with \"response\", then \"done\": true", _ndjson_text,
                    ("continue-ollama.json", 1))),
        True, _continue_settings),
    EditorClient(
        "tabby", "Tabby", "~/.tabby/config.toml",
        (ClientStep("POST", "/v1/completions", TABBY_STEP_BODY, "sse",
                    "SSE events with choices[0].text, not ending in the suffix", _sse_text,
                    ("tabby-openai-suffix.json", None)),),
        True, _tabby_settings),
)


def client_by_key(key: str) -> EditorClient:
    return next(c for c in CLIENTS if c.key == key)


def replay_body(client: EditorClient, step: ClientStep, model: str) -> dict[str, Any]:
    """The step's body as the editor would send it with our settings: the served model's
    name where the editor sends the one you set, and at most REPLAY_TOKENS new tokens."""
    body = copy.deepcopy(dict(step.body))
    if client.names_model and "model" in body:
        body["model"] = model
    if client.names_model and "name" in body:
        body["name"] = model
    for holder, key in ((body, "n_predict"), (body, "max_tokens"),
                        (body.get("options") or {}, "num_predict")):
        if isinstance(holder.get(key), int) and holder[key] > 0:
            holder[key] = min(holder[key], REPLAY_TOKENS)
    return body


class ClientTest(QObject):
    """Replay one client's requests in order; ``passed(str)`` or ``failed(str)`` (why)."""

    passed = Signal(str)
    failed = Signal(str)

    def __init__(self, client: EditorClient, worker: WorkerClient, model: str,
                 api_key: str = "", parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self._worker = worker
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._index = -1
        self._answers: list[Any] = []
        self._pending: JsonReply | SseStream | None = None
        self._timer = single_shot(REPLAY_TIMEOUT_MS, self)
        self._timer.timeout.connect(self._on_timeout)
        self.done = False

    def start(self) -> None:
        self._next()

    def abort(self) -> None:
        if self._pending is not None:
            self._pending.abort()
            self._pending.deleteLater()
            self._pending = None
        self._timer.stop()
        self.done = True

    def _next(self) -> None:
        self._index += 1
        steps = self.client.steps
        if self._index >= len(steps):
            self._finish(None)
            return
        step = steps[self._index]
        body = replay_body(self.client, step, self._model)
        self._answers = []
        reply: JsonReply | SseStream
        if step.reads == "json":
            reply = self._worker.call(step.method, step.path, body, headers=self._headers,
                                      timeout_ms=REPLAY_TIMEOUT_MS)
            reply.finished.connect(lambda answer: self._judge([answer]))
        else:
            opener = self._worker.stream if step.reads == "sse" else self._worker.lines
            stream = opener(step.method, step.path, body, headers=self._headers)
            stream.message.connect(self._answers.append)
            stream.finished.connect(lambda: self._judge(self._answers))
            reply = stream
        reply.failed.connect(self._on_failed)
        if self._pending is not None:
            self._pending.deleteLater()
        self._pending = reply
        self._timer.start()

    def _judge(self, answers: list[Any]) -> None:
        step = self.client.steps[self._index]
        why = step.check(answers)
        if why:
            self._finish(f"{step.method} {step.path}: {why} (expected {step.expect})")
        else:
            self._next()

    def _on_failed(self, failure: ApiFailure) -> None:
        step = self.client.steps[self._index]
        self._finish(f"{step.method} {step.path}: {failure.text()}")

    def _on_timeout(self) -> None:
        if self._pending is not None:
            self._pending.abort()
        self._finish(f"no answer within {REPLAY_TIMEOUT_MS // 1000} s")

    def _finish(self, why: str | None) -> None:
        if self.done:
            return
        self.done = True
        self._timer.stop()
        if self._pending is not None:
            self._pending.deleteLater()
        self._pending = None
        if why is None:
            steps = ", ".join(f"{s.method} {s.path}" for s in self.client.steps)
            self.passed.emit(f"works: {steps} answered as {self.client.name} expects")
        else:
            self.failed.emit(why)
