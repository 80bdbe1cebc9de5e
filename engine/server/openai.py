"""OpenAI dialect: /v1/chat/completions, /v1/completions, /v1/models.

- Chat applies the model's chat template; streaming sends one SSE chunk per token that
  adds text, then a chunk with ``finish_reason``, a usage chunk when
  ``stream_options.include_usage``, and ``[DONE]``.
- Completions take a raw prompt (special tokens parsed, no template), or with ``suffix``
  fill in the middle in the model's own FIM layout; the suffix is never appended. A model
  without FIM tokens completes code from the prompt alone (``engine.generation.fim_plain``: the
  suffix trims the answer; ``fim_lines`` picks one line or a block) when the suffix is
  not empty; an empty suffix there is a plain completion.
- ``n`` / ``best_of`` above 1 are refused with a message.
- ``tools`` / ``tool_choice`` / ``parallel_tool_calls``: engine/server/tools.py (the
  calls come back as ``message.tool_calls``, streamed name first, then argument
  fragments; ``finish_reason: "tool_calls"``).
- ``response_format`` ``json_object`` / ``json_schema`` (chat and completions) constrain
  the answer to JSON, this worker's ``regex`` / ``grammar`` types to a regex or a GBNF /
  Lark grammar (llguidance; engine/server/options.py); a closed value ends with
  ``stop``, one cut by ``max_tokens`` comes back as OpenAI answers it: the text so far
  with ``finish_reason: "length"``.
- Chat with ``X-Session-Id: NAME`` is a turn of a session the worker keeps: the answer is
  the same, but only the part of the conversation the session has not seen is prefilled
  (engine/server/sessions.py has the rules). The response echoes the header.
- ``usage.prompt_tokens_details.cached_tokens``: prompt tokens whose KV was reused (a
  session, the prefix cache, or the previous request's tokens) instead of prefilled.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response

from engine.engine import GenerateRequest
from engine.generation.fim_plain import fim_layout
from engine.generation.sampling import TokenLogprob
from engine.server.errors import ApiError, error_body
from engine.server.generation import Chunk, Final
from engine.server.models import LoadedModel
from engine.server.options import OPENAI_RENAMES, openai_options
from engine.server.schemas import ChatCompletionRequest, ChatMessageIn, CompletionRequest
from engine.server.sessions import HEADER, session_name
from engine.server.streaming import (
    SSE_DONE,
    Ctx,
    Item,
    JobStreamingResponse,
    collect,
    first_item,
    items_after,
    sse,
)
from engine.server.tools import (
    capabilities,
    chat_request,
    openai_calls,
    openai_deltas,
    openai_history,
    parse_chunks,
)
from engine.text.reasoning import describe_reasoning
from engine.text.tokenizer import ChatMessage, Tokenizer
from engine.text.tool_parse import CallParser

router = APIRouter(tags=["OpenAI"])

_FINISH = {"eos": "stop", "stop": "stop", "max_tokens": "length", "length": "length",
           "limit": "length", "cancelled": "stop"}


@dataclass(frozen=True)
class _Meta:
    id: str
    created: int
    model: str
    obj: str
    tokenizer: Tokenizer


def model_card(model: LoadedModel) -> dict[str, Any]:
    engine = model.engine
    return {"id": model.id, "object": "model", "created": int(model.loaded_at),
            "owned_by": "local",
            "meta": {"family": model.family, "context_length": engine.context_length,
                     "fim": engine.fim_family.name if engine.fim_family else None,
                     "fim_layout": fim_layout(engine.fim_family, engine.tokenizer),
                     "format": engine.model.format, "provider": engine.provider,
                     "capabilities": ["completion", "chat", "tools"]
                     if engine.tokenizer.has_chat_template else ["completion"],
                     "tool_calls": capabilities(model),
                     "reasoning": describe_reasoning(engine.tokenizer),
                     "path": str(model.path),
                     # what a request that leaves a field out gets here, and from where
                     "sampling": model.sampling.table("openai"),
                     "sampling_code": model.sampling.table("openai", code=True),
                     "sampling_problems": list(model.sampling.problems)}}


@router.get("/v1/models")
async def list_models(ctx: Ctx) -> dict[str, Any]:
    current = ctx.models.current
    return {"object": "list", "data": [model_card(current)] if current else []}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, ctx: Ctx) -> dict[str, Any]:
    current = ctx.models.current
    if current is None or not model_id.strip() or not current.matches(model_id):
        raise ApiError(404, f"the model {model_id!r} is not loaded here", param="model",
                       code="model_not_found")
    return model_card(current)


def _refuse_many(value: int | None, param: str) -> None:
    if value is not None and value != 1:
        raise ApiError(400, f"{param}: only 1 is supported, got {value}", param=param,
                       code="unsupported_value", hint=f"send {param}: 1 and repeat the request "
                       "for more answers")


def _message_text(message: ChatMessageIn, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.type != "text":
            raise ApiError(400, f"messages[{index}].content: {part.type!r} parts are not "
                           "supported; this worker runs text models", param="messages")
        texts.append(part.text or "")
    return "\n".join(texts)


def _token_text(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.decode([token])


def _chat_logprob(tokenizer: Tokenizer, lp: TokenLogprob) -> dict[str, Any]:
    def entry(token: int, value: float) -> dict[str, Any]:
        text = _token_text(tokenizer, token)
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}


def _completion_logprobs(tokenizer: Tokenizer, chunks: Sequence[Chunk], offset: int
                         ) -> dict[str, Any]:
    tokens, values, tops, offsets = [], [], [], []
    for chunk in chunks:
        if chunk.logprob is None:
            continue
        text = _token_text(tokenizer, chunk.logprob.token_id)
        tokens.append(text)
        values.append(chunk.logprob.logprob)
        tops.append({_token_text(tokenizer, t): v for t, v in chunk.logprob.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}


def usage(final: Final) -> dict[str, Any]:
    prompt, completion = final.result.prompt_tokens, final.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": final.result.prefix_cache_hit_len}}


def _meta(obj: str, prefix: str, model: LoadedModel) -> _Meta:
    return _Meta(f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time()), model.id, obj,
                 model.engine.tokenizer)


SessionHeader = Annotated[str | None, Header(
    alias=HEADER, description="Keep this conversation as a session on the worker (1..128 "
    "characters): only the new part of each turn is prefilled; the answer is unchanged.")]


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request, response: Response,
                           ctx: Ctx, x_session_id: SessionHeader = None
                           ) -> Response | dict[str, Any]:
    model = ctx.models.require(body.model)
    session = session_name(x_session_id)
    _refuse_many(body.n, "n")
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
    messages = tuple(ChatMessage(m.role, _message_text(m, i)) for i, m in enumerate(body.messages))
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None \
        else body.max_tokens
    options = openai_options(body, model, max_tokens=max_tokens,
                             top_logprobs=(body.top_logprobs or 0) if body.logprobs else None)
    history = openai_history(body.messages, [m.content for m in messages])
    gen, plan = chat_request(model, messages, history, options, tools=body.tools,
                             choice=body.tool_choice, parallel=body.parallel_tool_calls,
                             template_kwargs=body.chat_template_kwargs)
    handle = ctx.submit(model, gen, session=session)
    first = await first_item(handle, request, OPENAI_RENAMES)
    meta = _meta("chat.completion", "chatcmpl", model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        parser = plan.parser() if plan is not None else None
        streaming = JobStreamingResponse(_chat_stream(first, handle, meta, include_usage,
                                                      body.logprobs, parser), [handle],
                                         "text/event-stream")
        if session is not None:
            streaming.headers[HEADER] = session
        return streaming
    if session is not None:
        response.headers[HEADER] = session
    chunks, final = await collect(handle, request, first, OPENAI_RENAMES)
    logprobs = None
    if body.logprobs:
        logprobs = {"content": [_chat_logprob(meta.tokenizer, c.logprob) for c in chunks
                                if c.logprob is not None]}
    message: dict[str, Any] = {"role": "assistant", "content": final.text}
    if final.result.thoughts:  # a reasoning model's, as DeepSeek's and vLLM's APIs name it
        message["reasoning_content"] = final.result.thoughts
    finish = _FINISH[final.stop]
    if plan is not None:
        content, calls = parse_chunks(plan, chunks)
        message["content"] = content or (None if calls else "")
        if calls:
            message["tool_calls"] = openai_calls(calls)
            finish = "tool_calls" if finish == "stop" else finish
    return {"id": meta.id, "object": meta.obj, "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "message": message,
                         "logprobs": logprobs, "finish_reason": finish}],
            "usage": usage(final)}


async def _chat_stream(first: Item, handle: Any, meta: _Meta, include_usage: bool,
                       want_logprobs: bool, parser: CallParser | None = None
                       ) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None,
              logprobs: list[dict[str, Any]] | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": meta.id, "object": "chat.completion.chunk", "created": meta.created,
            "model": meta.model,
            "choices": [{"index": 0, "delta": delta,
                         "logprobs": {"content": logprobs} if logprobs else None,
                         "finish_reason": finish}]}
        if include_usage:
            payload["usage"] = None
        return sse(payload)

    yield chunk({"role": "assistant", "content": ""})
    pending: list[dict[str, Any]] = []
    try:
        async for item in items_after(first, handle):
            if isinstance(item, Final):
                finish = _FINISH[item.stop]
                if parser is not None:
                    for delta in openai_deltas(parser.finish()):
                        yield chunk(delta, None, pending or None)
                        pending = []
                    finish = "tool_calls" if parser.calls and finish == "stop" else finish
                yield chunk({}, finish, pending or None)
                if include_usage:
                    yield sse({"id": meta.id, "object": "chat.completion.chunk",
                               "created": meta.created, "model": meta.model, "choices": [],
                               "usage": usage(item)})
                break
            if want_logprobs and item.logprob is not None:
                pending.append(_chat_logprob(meta.tokenizer, item.logprob))
            if item.thought:
                yield chunk({"reasoning_content": item.thought}, None, pending or None)
                pending = []
            if parser is not None:
                deltas = openai_deltas(parser.feed(item.text, item.token_id))
            else:
                deltas = [{"content": item.text}] if item.text else []
            for delta in deltas:
                yield chunk(delta, None, pending or None)
                pending = []
    except ApiError as exc:
        yield sse(error_body(exc, "openai"))
    yield SSE_DONE


def _single_prompt(prompt: str | list[Any]) -> str | tuple[int, ...]:
    if isinstance(prompt, str):
        return prompt
    if prompt and all(isinstance(p, int) for p in prompt):
        return tuple(prompt)
    if len(prompt) == 1:
        only = prompt[0]
        return only if isinstance(only, str) else tuple(only)
    raise ApiError(400, f"prompt: one prompt per request, got {len(prompt)}", param="prompt",
                   hint="send the prompts as separate requests")


async def _completion_request(body: CompletionRequest, model: LoadedModel) -> GenerateRequest:
    prompt = _single_prompt(body.prompt)
    engine = model.engine
    code = body.suffix is not None and bool(body.suffix or engine.fim_family is not None)
    options = openai_options(body, model, max_tokens=body.max_tokens,
                             top_logprobs=body.logprobs, logprobs_field="logprobs", code=code)
    if code:
        if not isinstance(prompt, str):
            raise ApiError(400, "suffix: needs a text prompt (the code before the cursor)",
                           param="suffix")
        if body.echo:
            raise ApiError(400, "echo: cannot be combined with suffix", param="echo")
        return await asyncio.to_thread(lambda: engine.fim_request(
            prompt, body.suffix or "", options, lines=body.fim_lines))
    if isinstance(prompt, str):
        return GenerateRequest(prompt=prompt, options=options)
    return GenerateRequest(token_ids=prompt, options=options)


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request,
                      ctx: Ctx) -> Response | dict[str, Any]:
    model = ctx.models.require(body.model)
    _refuse_many(body.n, "n")
    _refuse_many(body.best_of, "best_of")
    if body.echo and body.logprobs is not None:
        raise ApiError(400, "echo: prompt logprobs are not computed; drop echo or logprobs",
                       param="echo")
    gen = await _completion_request(body, model)
    echo = ""
    if body.echo:
        echo = gen.prompt if gen.prompt is not None else model.engine.tokenizer.decode(
            gen.token_ids or ())
    handle = ctx.submit(model, gen)
    first = await first_item(handle, request, OPENAI_RENAMES)
    meta = _meta("text_completion", "cmpl", model)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    want_logprobs = body.logprobs is not None
    if body.stream:
        return JobStreamingResponse(_completion_stream(first, handle, meta, include_usage,
                                                       want_logprobs, echo),
                                    [handle], "text/event-stream")
    chunks, final = await collect(handle, request, first, OPENAI_RENAMES)
    logprobs = _completion_logprobs(meta.tokenizer, chunks, 0) if want_logprobs else None
    return {"id": meta.id, "object": meta.obj, "created": meta.created, "model": meta.model,
            "choices": [{"index": 0, "text": echo + final.text, "logprobs": logprobs,
                         "finish_reason": _FINISH[final.stop]}],
            "usage": usage(final)}


async def _completion_stream(first: Item, handle: Any, meta: _Meta, include_usage: bool,
                             want_logprobs: bool, echo: str) -> AsyncIterator[bytes]:
    def chunk(text: str, finish: str | None = None,
              logprobs: dict[str, Any] | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": meta.id, "object": "text_completion", "created": meta.created,
            "model": meta.model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs,
                         "finish_reason": finish}]}
        if include_usage:
            payload["usage"] = None
        return sse(payload)

    if echo:
        yield chunk(echo)
    offset, pending = len(echo), list[Chunk]()
    try:
        async for item in items_after(first, handle):
            if isinstance(item, Final):
                lp = _completion_logprobs(meta.tokenizer, pending, offset) if pending else None
                yield chunk("", _FINISH[item.stop], lp)
                if include_usage:
                    yield sse({"id": meta.id, "object": "text_completion",
                               "created": meta.created, "model": meta.model, "choices": [],
                               "usage": usage(item)})
                break
            if want_logprobs and item.logprob is not None:
                pending.append(item)
            if item.text:
                lp = _completion_logprobs(meta.tokenizer, pending, offset) if pending else None
                yield chunk(item.text, None, lp)
                offset += len(item.text)
                pending = []
    except ApiError as exc:
        yield sse(error_body(exc, "openai"))
    yield SSE_DONE

