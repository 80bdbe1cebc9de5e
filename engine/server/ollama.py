"""Ollama dialect (Continue's recommended local autocomplete): /api/tags, /api/show,
/api/ps, /api/generate, /api/chat.

Bodies are read as JSON whatever their ``Content-Type`` (Ollama's curl examples send
``-d`` without one, which curl labels form data). ``keep_alive`` is Ollama's
(``engine.server.keep_alive``: 0 unloads after the answer, the next request loads the
model again); ``/api/ps`` lists the loaded model and when it expires.

``/api/show``'s ``template`` contains ``.Suffix`` (Continue enables autocomplete on
that) and ``fim_layout`` names the layout (``psm``, ``spm``, ``codestral``, or
``prefix-only`` for a model without FIM tokens); its ``parameters`` are single
``key value`` lines (``num_ctx``, ``stop "..."``) with no blank line, as Continue parses
them. The template only describes the layout: the worker builds prompts itself.
``/api/generate`` with ``suffix`` fills in the middle in the model's layout (prefix-only:
``engine.generation.fim_plain``, with ``fim_lines`` for one line or a block); with ``raw``
the prompt is sent as is (special tokens parsed); otherwise it becomes a user message in
the chat template (or stays raw when the model has none). ``format`` (``"json"`` or a
schema) constrains the answer to JSON. Streams are NDJSON; an error after the first line
arrives as a ``{"error": ...}`` line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.engine import Engine, GenerateRequest
from engine.generation.fim_plain import fim_layout
from engine.server.errors import ApiError, error_body
from engine.server.generation import Final
from engine.server.keep_alive import FOREVER_S, keep_alive_of, parse_keep_alive
from engine.server.models import LoadedModel
from engine.server.options import OLLAMA_RENAMES, ollama_options
from engine.server.schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaShowRequest
from engine.server.streaming import (
    Ctx,
    Item,
    JobStreamingResponse,
    ServerContext,
    collect,
    first_item,
    items_after,
    ndjson,
)
from engine.server.tools import (
    ToolPlan,
    capabilities,
    chat_request,
    ollama_calls,
    ollama_history,
    ollama_messages,
    parse_chunks,
)
from engine.text.tokenizer import ChatMessage

router = APIRouter(tags=["Ollama"])

_TURN_TOKENS = ("<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def _details(model: LoadedModel) -> dict[str, Any]:
    return {"parent_model": "", "format": "onnx", "family": model.family,
            "families": [model.family], "parameter_size": "",
            "quantization_level": model.engine.model.graph.quantization}


def _find(ctx: ServerContext, name: str) -> LoadedModel:
    model = ctx.models.current
    if model is None or not model.matches(name):
        raise ApiError(404, f"model '{name}' not found", code="model_not_found")
    return model


@router.get("/api/tags")
async def tags(ctx: Ctx) -> dict[str, Any]:
    model = ctx.models.current
    if model is None:
        return {"models": []}
    size = model.engine.model.weights_bytes
    digest = hashlib.sha256(f"{model.path}|{size}".encode()).hexdigest()
    return {"models": [{"name": model.id, "model": model.id,
                        "modified_at": _iso(model.loaded_at), "size": size, "digest": digest,
                        "details": _details(model)}]}


@router.get("/api/ps")
async def ps(ctx: Ctx) -> dict[str, Any]:
    """The loaded model, as Ollama lists running ones."""
    model = ctx.models.current
    if model is None:
        return {"models": []}
    expires = keep_alive_of(ctx.models).expires_at
    size = model.engine.model.weights_bytes
    on_device = model.engine.provider != "cpu"
    digest = hashlib.sha256(f"{model.path}|{size}".encode()).hexdigest()
    return {"models": [{"name": model.id, "model": model.id, "size": size, "digest": digest,
                        "details": _details(model),
                        "expires_at": _iso(expires if expires is not None
                                           else time.time() + FOREVER_S),
                        "size_vram": size if on_device else 0,
                        "context_length": model.engine.context_length}]}


def fim_template(engine: Engine) -> str:
    """A Go-template description of the model's prompt; it mentions .Suffix (Continue's
    test for autocomplete) for every model: one without FIM tokens takes the suffix too,
    to trim its prefix-only answer, and its template says so."""
    family = engine.fim_family
    if family is None:
        return ("{{- if .Suffix }}{{ .Prompt }}{{/* prefix-only: .Suffix trims the answer */}}"
                "{{- else }}{{ .Prompt }}{{- end }}")

    def spell(token: int) -> str:
        return (engine.tokenizer.id_to_token(token) or "").replace("▁", " ")

    pre, suf, mid = spell(family.prefix_id), spell(family.suffix_id), spell(family.middle_id)
    if family.name == "codestral":
        fim = f"{suf}{{{{ .Suffix }}}}{pre}{{{{ .Prompt }}}}"
    else:
        fim = f"{pre}{{{{ .Prompt }}}}{suf}{{{{ .Suffix }}}}{mid}"
    return f"{{{{- if .Suffix }}}}{fim}{{{{- else }}}}{{{{ .Prompt }}}}{{{{- end }}}}"


def _stop_texts(engine: Engine) -> list[str]:
    tokenizer = engine.tokenizer
    texts = [tokenizer.id_to_token(t) for t in engine.eos_token_ids]
    texts += [t for t in _TURN_TOKENS if tokenizer.token_to_id(t) is not None]
    return [t for t in dict.fromkeys(texts) if t]


#: This worker's field names as a Modelfile's PARAMETER lines spell them.
_MODELFILE_NAMES = {"repetition_penalty": "repeat_penalty", "max_tokens": "num_predict"}


@router.post("/api/show")
async def show(body: OllamaShowRequest, ctx: Ctx
               ) -> dict[str, Any]:
    model = _find(ctx, body.model or body.name)
    engine = model.engine
    params = [("num_ctx", str(engine.context_length))]
    table = model.sampling.table("ollama")
    params += [(_MODELFILE_NAMES.get(k, k), f"{v['value']:g}") for k, v in table.items()
               if not str(v["source"]).endswith("default")]  # the model's own, not Ollama's
    params += [("stop", json.dumps(s, ensure_ascii=False)) for s in _stop_texts(engine)]
    parameters = "\n".join(f"{key:<30} {value}" for key, value in params)
    template = fim_template(engine)
    tools = capabilities(model)
    modelfile = "\n".join([f"# Modelfile of {model.id} (served by onnx-local-llm)",
                           f"FROM {model.path}", f'TEMPLATE """{template}"""',
                           *(f"PARAMETER {k} {v}" for k, v in params)])
    return {"license": "", "modelfile": modelfile, "parameters": parameters,
            "template": template, "details": _details(model),
            "fim_layout": fim_layout(engine.fim_family, engine.tokenizer),
            "model_info": {"general.architecture": model.family,
                           f"{model.family}.context_length": engine.context_length},
            "capabilities": ["completion", "insert", *(["tools"] if tools else [])],
            "tool_calls": tools, "modified_at": _iso(model.loaded_at),
            # each value a request that leaves it out gets, and where it comes from
            "sampling": table, "sampling_code": model.sampling.table("ollama", code=True)}


def _stats(final: Final) -> dict[str, Any]:
    timings = final.result.timings
    prompt_ms = timings.ttft_ms if final.completion_tokens else timings.total_ms
    return {"done_reason": "length" if final.stop in ("max_tokens", "length", "limit")
            else "stop",
            "total_duration": int(timings.total_ms * 1e6), "load_duration": 0,
            "prompt_eval_count": final.result.prompt_tokens,
            "prompt_eval_duration": int(prompt_ms * 1e6),
            "eval_count": final.completion_tokens,
            "eval_duration": int(max(timings.total_ms - prompt_ms, 0.0) * 1e6)}


def _refuse(images: Any) -> None:
    if images:
        raise ApiError(400, "images are not supported: this worker runs text models")


async def _answer(ctx: ServerContext, request: Request, model: LoadedModel, gen: GenerateRequest,
                  stream: bool, shape: Shape, keep: float | None,
                  priority: str = "normal", tools: ToolPlan | None = None
                  ) -> Response | dict[str, Any]:
    alive = keep_alive_of(ctx.models)
    alive.begin()
    try:
        handle = ctx.submit(model, gen, priority="high" if priority == "high" else "normal")
        first = await first_item(handle, request, OLLAMA_RENAMES)
        if stream:
            return JobStreamingResponse(_lines(first, handle, model, shape, keep, ctx, tools),
                                        [handle], "application/x-ndjson")
        chunks, final = await collect(handle, request, first, OLLAMA_RENAMES)
    except BaseException:
        await alive.end(None)
        raise
    await alive.end(keep)
    answer = shape(final.text, final.result.thoughts)
    if tools is not None:
        content, calls = parse_chunks(tools, chunks)
        answer = shape(content, final.result.thoughts)
        if calls:
            answer["message"]["tool_calls"] = ollama_calls(calls)
    return {"model": model.id, "created_at": _now(), **answer, "done": True,
            **_stats(final)}


async def _lines(first: Item, handle: Any, model: LoadedModel,
                 shape: Shape, keep: float | None,
                 ctx: ServerContext, tools: ToolPlan | None = None) -> AsyncIterator[bytes]:
    ended: float | None = None
    parser = tools.parser() if tools is not None else None
    try:
        async for item in items_after(first, handle):
            if isinstance(item, Final):
                for message in ollama_messages(parser.finish()) if parser else []:
                    yield ndjson({"model": model.id, "created_at": _now(), "message": message,
                                  "done": False})
                yield ndjson({"model": model.id, "created_at": _now(), **shape("", ""),
                              "done": True, **_stats(item)})
                ended = keep
                return
            if item.thought:
                yield ndjson({"model": model.id, "created_at": _now(),
                              **shape("", item.thought), "done": False})
            if parser is not None:
                for message in ollama_messages(parser.feed(item.text, item.token_id)):
                    yield ndjson({"model": model.id, "created_at": _now(), "message": message,
                                  "done": False})
            elif item.text:
                yield ndjson({"model": model.id, "created_at": _now(), **shape(item.text, ""),
                              "done": False})
    except ApiError as exc:
        yield ndjson(error_body(exc, "ollama"))
    finally:
        await keep_alive_of(ctx.models).end(ended)


@router.post("/api/generate", response_model=None)
async def generate(body: OllamaGenerateRequest, request: Request,
                   ctx: Ctx) -> Response | dict[str, Any]:
    keep = parse_keep_alive(body.keep_alive)
    alive = keep_alive_of(ctx.models)
    if not body.prompt and not body.suffix and keep == 0:  # Ollama's "unload the model"
        model = ctx.models.require(body.model)
        await alive.unload()
        return {"model": model.id, "created_at": _now(), "response": "", "done": True,
                "done_reason": "unload"}
    model = await alive.model_for(body.model)
    _refuse(body.images)
    engine = model.engine
    if not body.prompt and not body.suffix:  # Ollama's "load the model" request
        alive.begin()
        await alive.end(keep)
        return {"model": model.id, "created_at": _now(), "response": "", "done": True,
                "done_reason": "load"}
    options = ollama_options(body.options, model, body.format, code=bool(body.suffix))
    if body.suffix:
        gen = await asyncio.to_thread(lambda: engine.fim_request(
            body.prompt, body.suffix or "", options, lines=body.fim_lines))
    elif body.raw or not engine.tokenizer.has_chat_template:
        prompt = body.prompt if body.raw or not body.system else f"{body.system}\n\n{body.prompt}"
        gen = GenerateRequest(prompt=prompt, options=options)
    else:
        messages = [ChatMessage("system", body.system)] if body.system else []
        messages.append(ChatMessage("user", body.prompt))
        gen = GenerateRequest(messages=tuple(messages), options=options)
    return await _answer(ctx, request, model, gen, body.stream,
                         _generate_shape, keep,
                         priority="high" if body.suffix else "normal")


@router.post("/api/chat", response_model=None)
async def chat(body: OllamaChatRequest, request: Request,
               ctx: Ctx) -> Response | dict[str, Any]:
    keep = parse_keep_alive(body.keep_alive)
    alive = keep_alive_of(ctx.models)
    if not body.messages and keep == 0:  # Ollama's "unload the model"
        model = ctx.models.require(body.model)
        await alive.unload()
        return {"model": model.id, "created_at": _now(),
                "message": {"role": "assistant", "content": ""}, "done": True,
                "done_reason": "unload"}
    model = await alive.model_for(body.model)
    if not body.messages:  # Ollama's "load the model" request
        alive.begin()
        await alive.end(keep)
        return {"model": model.id, "created_at": _now(),
                "message": {"role": "assistant", "content": ""}, "done": True,
                "done_reason": "load"}
    _refuse(any(m.images for m in body.messages))
    messages = tuple(ChatMessage(m.role, m.content) for m in body.messages)
    options = ollama_options(body.options, model, body.format)
    history = ollama_history(body.messages)
    # Ollama's ``think``: the templates of Qwen3 and its kin read ``enable_thinking``
    think = None if body.think is None else {"enable_thinking": body.think}
    gen, plan = chat_request(model, messages, history, options, tools=body.tools,
                             format_param="format", template_kwargs=think)
    return await _answer(ctx, request, model, gen, body.stream, _chat_shape, keep, tools=plan)


#: The answer's fields from its text and a reasoning model's thoughts.
Shape = Callable[[str, str], dict[str, Any]]


def _chat_shape(text: str, thinking: str = "") -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {"message": {**message, "thinking": thinking} if thinking else message}


def _generate_shape(text: str, thinking: str = "") -> dict[str, Any]:
    return {"response": text, "thinking": thinking} if thinking else {"response": text}
