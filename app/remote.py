"""A remote server (vLLM, llama.cpp's server, Ollama, LM Studio, another machine's worker):
what it has, probed once on connect, and how the Code pane asks it for a completion.

:class:`RemoteProbe` asks ``GET /v1/models``, ``/props`` (llama.cpp's server and this app's
worker), ``/api/version`` (Ollama) and ``/v1/resources`` (this app's worker) at once and
makes a :class:`RemoteCaps`. Its ``paths`` are the ways to ask for a fill-in-the-middle
completion, best first:

1. ``infill``: ``POST /infill`` (llama.cpp's dialect), where ``/props`` answers;
2. ``suffix``: ``POST /v1/completions`` with ``suffix`` (OpenAI's legacy field);
3. ``template``: the model family's FIM tokens laid out by hand on a raw
   ``/v1/completions`` prompt (a family told by the model's name: Qwen coder, StarCoder,
   CodeLlama, DeepSeek coder, CodeGemma);
4. ``prefix``: ``/v1/completions`` on the text before the cursor alone.

A path the server refuses (404, 405, 400/422 naming the field, 501) is dropped and the
next one tried; a server that takes ``suffix`` but only appends it to the text (what
llama-cpp-python does for a model without FIM tokens) is treated as ``prefix``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.client import ApiFailure, WorkerClient

#: FIM layouts by family: (before the prefix, before the suffix, before the middle).
FIM_TEMPLATES: dict[str, tuple[str, str, str]] = {
    "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "codellama": ("<PRE> ", " <SUF>", " <MID>"),
    "deepseek": ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    "codegemma": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
}
PATH_WORDS = {"infill": "/infill", "suffix": "/v1/completions with a suffix",
              "template": "/v1/completions with the model's FIM tokens",
              "prefix": "/v1/completions on the text before the cursor (no FIM)"}
REFUSED = (400, 404, 405, 422, 501)


def fim_family(model_id: str) -> str | None:
    """The FIM family a model's name tells, if any."""
    name = model_id.lower()
    if "qwen" in name and "coder" in name:
        return "qwen"
    for family, marks in (("starcoder", ("starcoder", "santacoder")),
                          ("codellama", ("codellama", "code-llama")),
                          ("deepseek", ("deepseek-coder",)), ("codegemma", ("codegemma",))):
        if any(mark in name for mark in marks):
            return family
    return None


@dataclass
class RemoteCaps:
    url: str
    models: list[str] = field(default_factory=list)
    server: str = "an OpenAI-compatible server"
    has_props: bool = False
    has_resources: bool = False
    family: str | None = None
    paths: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.paths[0] if self.paths else "prefix"

    def drop_path(self) -> bool:
        """Give up the current path; whether another is left to try."""
        if len(self.paths) > 1:
            self.paths.pop(0)
            return True
        return False

    def words(self) -> str:
        """One sentence for the status: the server, its models, what the app uses."""
        if self.problems and not self.models:
            why = self.problems[0].split(": ", 1)[-1].rstrip(".")
            return (f"The server at {self.url} did not list its models: {why}. Check the "
                    "URL and that the server is running, then apply again.")
        models = ", ".join(self.models[:3]) + ("…" if len(self.models) > 3 else "")
        gauges = "reported" if self.has_resources else "not reported by this server"
        return (f"Connected to {self.server} at {self.url}: "
                f"{'model ' + models if models else 'no model listed'}. Code completion "
                f"through {PATH_WORDS[self.path]}; memory and speed gauges: {gauges}.")


def plan_paths(caps: RemoteCaps) -> list[str]:
    paths = ["infill"] if caps.has_props else []
    paths.append("suffix")
    if caps.family:
        paths.append("template")
    paths.append("prefix")
    return paths


class RemoteProbe(QObject):
    """Asks the server what it has; ``done(RemoteCaps)`` once every probe answered."""

    done = Signal(object)

    def __init__(self, client: WorkerClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.caps = RemoteCaps(client.base_url)
        self._waiting = 0
        for path, handler in (("/v1/models", self._models), ("/props", self._props),
                              ("/api/version", self._ollama),
                              ("/v1/resources", self._resources)):
            reply = client.get(path)
            self._waiting += 1
            reply.finished.connect(lambda body, h=handler: self._answered(h, body))
            reply.failed.connect(lambda failure, p=path: self._failed(p, failure))

    def _answered(self, handler: Any, body: Any) -> None:
        handler(body if isinstance(body, dict) else {})
        self._one_less()

    def _failed(self, path: str, failure: ApiFailure) -> None:
        if path == "/v1/models":
            self.caps.problems.append(f"{path}: {failure.message}")
        self._one_less()

    def _one_less(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            caps = self.caps
            caps.family = next((f for f in map(fim_family, caps.models) if f), None)
            caps.paths = plan_paths(caps)
            self.done.emit(caps)

    def _models(self, body: dict[str, Any]) -> None:
        data = body.get("data") or body.get("models") or []
        self.caps.models = [str(m.get("id") or m.get("name")) for m in data
                            if isinstance(m, dict) and (m.get("id") or m.get("name"))]
        owner = next((m.get("owned_by") for m in data if isinstance(m, dict)), None)
        if owner and isinstance(owner, str) and owner not in ("me", "user", "system"):
            self.caps.server = f"a server ({owner})"

    def _props(self, body: dict[str, Any]) -> None:
        self.caps.has_props = bool(body)
        if body:
            self.caps.server = "a llama.cpp-style server"

    def _ollama(self, body: dict[str, Any]) -> None:
        if body.get("version"):
            self.caps.server = f"Ollama {body['version']}"

    def _resources(self, body: dict[str, Any]) -> None:
        self.caps.has_resources = isinstance(body.get("governor"), dict) or "state" in body
        if self.caps.has_resources:
            self.caps.server = "an ONNX Local LLM worker"


def fim_request(caps: RemoteCaps, prefix: str, typed: str, suffix: str, n_predict: int,
                mid_line: bool) -> tuple[str, dict[str, Any]]:
    """(path, body) for the current FIM path."""
    model = caps.models[0] if caps.models else ""
    stop = ["\n"] if mid_line else ["\n\n"]
    path = caps.path
    if path == "infill":
        body: dict[str, Any] = {"input_prefix": prefix, "input_suffix": suffix,
                                "prompt": typed, "n_predict": n_predict, "temperature": 0.0,
                                "stream": False, "cache_prompt": True}
        if mid_line:
            body["stop"] = stop
        return "/infill", body
    common = {"model": model, "max_tokens": n_predict, "temperature": 0.0, "stream": False,
              "stop": stop}
    if path == "suffix":
        return "/v1/completions", {**common, "prompt": prefix + typed, "suffix": suffix}
    if path == "template" and caps.family in FIM_TEMPLATES:
        pre, suf, mid = FIM_TEMPLATES[caps.family]
        return "/v1/completions", {**common, "prompt": f"{pre}{prefix}{typed}{suf}{suffix}{mid}"}
    return "/v1/completions", {**common, "prompt": prefix + typed}


def fim_answer(caps: RemoteCaps, body: Any, suffix: str) -> dict[str, Any]:
    """The answer as the Code pane reads ``/infill``'s: ``content``, ``tokens_predicted``."""
    if caps.path == "infill":
        item = body[0] if isinstance(body, list) and body else body
        return item if isinstance(item, dict) else {}
    body = body if isinstance(body, dict) else {}
    choices = body.get("choices") or [{}]
    text = str((choices[0] or {}).get("text") or "")
    if caps.path == "suffix" and suffix.strip() and text.endswith(suffix):
        text = text[:-len(suffix)]  # the suffix appended, not used: the model saw no suffix
        caps.paths = [p for p in caps.paths if p != "suffix"] or ["prefix"]
    usage = body.get("usage") or {}
    return {"content": text, "tokens_predicted": usage.get("completion_tokens", 0)}


def refused(failure: ApiFailure) -> bool:
    """Whether a failure says the server has no such path (try the next one)."""
    return failure.status in REFUSED
