"""llama.cpp dialect: /infill, /completion, /props, /tokenize, /detokenize, /apply-template.

Answers are compact JSON (llama.vim matches ``"content"\\s*:"``). ``response_fields``
picks fields by path and returns them under the path itself (``"timings/prompt_n"``).
``n_predict: 0`` (llama.vim's cache warm-up) answers at once; when the engine is idle it
then runs that prompt in the background so its KV lands in the prefix cache.
``t_max_predict_ms`` is llama.cpp's: once it has run out (measured from the first token)
the answer stops at the next token holding a line break, with ``stop_type: "limit"`` and
``limit: "t_max_predict_ms"``; ``t_max_prompt_ms`` is echoed and not enforced (llama.cpp
does not either, and llama.vim's 500 ms default would empty every cold suggestion).
``tokens_evaluated`` is the prompt's length, ``tokens_cached`` the part of it whose KV
was reused, ``timings.prompt_n`` the rest (the tokens actually processed) and
``timings.cache_n`` the reused part again. Field-by-field differences from llama.cpp's
``tools/server/README.md``: docs/llamacpp-fields.md.
``id_slot`` and ``cache_prompt`` are accepted and change nothing: the scheduler already
gives a request the runner whose cache shares most of its prompt, and prompt KV is always
reused (prefix cache, tiered store). ``json_schema`` constrains the output to JSON
(``{}``: any value), ``grammar`` to a GBNF grammar, ``regex`` to a regular expression
(llguidance, ``engine.generation.guidance``).
/infill on a model without FIM tokens uses the prefix-only layout (``engine.generation.fim_plain``);
``fim_lines`` (``auto``/``single``/``multi``) picks one line or a block. /infill answers
add ``fim_layout`` (``psm``, ``spm``, ``codestral``, ``prefix-only``; as ``/props``) and
``fim_stop``, the completion rule that ended a prefix-only answer (``line_end``,
``dedent``, ``blank_line``, ``suffix_line``, ``suffix_bracket``; null otherwise).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.config import GenerateOptions
from engine.engine import GenerateRequest
from engine.generation.fim_plain import fim_layout
from engine.server.errors import ApiError, error_body
from engine.server.generation import Final, Limits
from engine.server.infill import InfillPrompt, build_infill, warm_job
from engine.server.models import LoadedModel
from engine.server.options import LLAMA_RENAMES, llama_options
from engine.server.schemas import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    InfillRequest,
    LlamaCompletionRequest,
    LlamaSampling,
    TokenizeRequest,
)
from engine.server.streaming import (
    Ctx,
    JobStreamingResponse,
    ServerContext,
    collect,
    first_item,
    items_after,
    sse,
)
from engine.text.fim import FimFile
from engine.text.tokenizer import ChatMessage

router = APIRouter(tags=["llama.cpp"])

MAX_COMPLETIONS = 8
_STOP_TYPE = {"eos": "eos", "stop": "word", "max_tokens": "limit", "length": "limit",
              "limit": "limit", "cancelled": "none"}


def select_fields(body: dict[str, Any], fields: Sequence[str] | None) -> dict[str, Any]:
    """llama.cpp's ``response_fields``: each path's value under the path string itself."""
    if not fields:
        return body
    out: dict[str, Any] = {}
    for path in fields:
        node: Any = body
        for part in path.split("/"):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out[path] = node
    return out


def _settings(options: GenerateOptions, model: LoadedModel, body: LlamaSampling
              ) -> dict[str, Any]:
    return {"n_ctx": model.engine.context_length, "n_predict": body.n_predict,
            "temperature": options.temperature, "top_k": options.top_k,
            "top_p": options.top_p, "min_p": options.min_p,
            "repeat_penalty": options.repetition_penalty,
            "seed": -1 if options.seed is None else options.seed,
            "stop": [s for s in options.stop_sequences if isinstance(s, str)],
            "n_indent": body.n_indent, "t_max_prompt_ms": body.t_max_prompt_ms or -1,
            "t_max_predict_ms": body.t_max_predict_ms or -1}


def _timings(final: Final) -> dict[str, float]:
    result = final.result
    cache_n = min(result.prefix_cache_hit_len, result.prompt_tokens)
    prompt_n, predicted_n = result.prompt_tokens - cache_n, final.completion_tokens
    prompt_ms = result.timings.ttft_ms if predicted_n else result.timings.total_ms
    predicted_ms = max(result.timings.total_ms - prompt_ms, 0.0)
    return {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / (prompt_ms / 1e3) if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": predicted_n / (predicted_ms / 1e3) if predicted_ms > 0
            else 0.0}


def completion_body(final: Final, model: LoadedModel, options: GenerateOptions,
                    body: LlamaSampling, *, index: int = 0, truncated: bool = False,
                    dropped: int = 0, infill: bool = False) -> dict[str, Any]:
    stop_type = _STOP_TYPE[final.stop]
    reason = final.result.finish_reason
    word = ""
    if reason.kind == "stop_sequence" and reason.stop_index is not None:
        stop = options.stop_sequences[reason.stop_index]
        word = stop if isinstance(stop, str) else model.engine.tokenizer.decode(stop)
    limit = final.limit or ("n_predict" if final.stop == "max_tokens" else
                            "n_ctx" if final.stop == "length" else None)
    fim = {"fim_layout": fim_layout(model.engine.fim_family, model.engine.tokenizer),
           "fim_stop": final.rule} if infill else {}
    tokens = list(final.result.token_ids) if body.return_tokens else []
    return {"index": index, "content": final.text, "tokens": tokens, "id_slot": 0, "stop": True,
            "model": model.id, "tokens_predicted": final.completion_tokens,
            "tokens_evaluated": final.result.prompt_tokens,
            "generation_settings": _settings(options, model, body),
            "has_new_line": "\n" in final.text, "truncated": truncated,
            "tokens_dropped": dropped, "stop_type": stop_type,
            "stopped_eos": stop_type == "eos", "stopped_word": stop_type == "word",
            "stopped_limit": stop_type == "limit", "stopping_word": word, "limit": limit,
            "tokens_cached": min(final.result.prefix_cache_hit_len, final.result.prompt_tokens),
            "timings": _timings(final),
            **fim}


def _warm_body(model: LoadedModel) -> dict[str, Any]:
    zero = {"cache_n": 0, "prompt_n": 0, "prompt_ms": 0.0, "prompt_per_token_ms": 0.0,
            "prompt_per_second": 0.0, "predicted_n": 0, "predicted_ms": 0.0,
            "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0}
    return {"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True,
            "model": model.id, "tokens_predicted": 0, "tokens_evaluated": 0,
            "has_new_line": False, "truncated": False, "stop_type": "limit",
            "stopped_eos": False, "stopped_word": False, "stopped_limit": True,
            "stopping_word": "", "limit": "n_predict", "tokens_cached": 0, "timings": zero}


def _check(body: LlamaSampling) -> int:
    if not 1 <= body.n_cmpl <= MAX_COMPLETIONS:
        raise ApiError(400, f"n_cmpl: expected 1..{MAX_COMPLETIONS}, got {body.n_cmpl}",
                       param="n_cmpl")
    if body.n_cmpl > 1 and body.stream:
        raise ApiError(400, "n_cmpl: several completions cannot be streamed",
                       param="n_cmpl", hint="send stream: false")
    return body.n_cmpl


def _limits(body: LlamaSampling) -> Limits:
    def positive(value: float | None) -> float | None:
        return value if value is not None and value > 0 else None

    return Limits(predict_ms=positive(body.t_max_predict_ms), n_indent=max(body.n_indent, 0))


async def _run(ctx: ServerContext, request: Request, model: LoadedModel, body: LlamaSampling,
               prompts: Sequence[tuple[GenerateRequest, InfillPrompt | None]]
               ) -> Response | dict[str, Any] | list[dict[str, Any]]:
    limits = _limits(body)
    handles = [ctx.submit(model, gen, limits=limits, priority="high") for gen, _ in prompts]
    try:
        firsts = [await first_item(h, request, LLAMA_RENAMES) for h in handles[:1]]
    except BaseException:
        for handle in handles:
            handle.cancel()
        raise
    if body.stream:
        gen, fitted = prompts[0]
        return JobStreamingResponse(
            _stream(firsts[0], handles[0], model, gen.options, body, fitted), handles,
            "text/event-stream")
    answers = []
    try:
        for index, ((gen, fitted), handle) in enumerate(zip(prompts, handles, strict=True)):
            _, final = await collect(handle, request, firsts[0] if index == 0 else None,
                                     LLAMA_RENAMES)
            answer = completion_body(final, model, gen.options, body, index=index,
                                     truncated=bool(fitted and fitted.truncated),
                                     dropped=fitted.dropped_tokens if fitted else 0,
                                     infill=fitted is not None)
            answers.append(select_fields(answer, body.response_fields))
    finally:
        for handle in handles:
            handle.cancel()  # a no-op for finished jobs; stops the rest on errors
    return answers[0] if len(answers) == 1 else answers


async def _stream(first: Any, handle: Any, model: LoadedModel, options: GenerateOptions,
                  body: LlamaSampling, fitted: InfillPrompt | None) -> AsyncIterator[bytes]:
    predicted = 0
    try:
        async for item in items_after(first, handle):
            if isinstance(item, Final):
                answer = completion_body(item, model, options, body,
                                         truncated=bool(fitted and fitted.truncated),
                                         dropped=fitted.dropped_tokens if fitted else 0,
                                         infill=fitted is not None)
                yield sse({**select_fields(answer, body.response_fields), "content": ""})
                return
            predicted += item.is_step
            if item.text or item.is_step:  # one event per token, even one still held back
                yield sse({"index": 0, "content": item.text,
                           "tokens": [] if item.token_id is None else [item.token_id],
                           "stop": False, "id_slot": 0, "tokens_predicted": predicted})
    except ApiError as exc:
        yield sse(error_body(exc, "llamacpp"))


def _warm(ctx: ServerContext, model: LoadedModel, body: InfillRequest,
          files: Sequence[FimFile]) -> None:
    """Fill the prefix cache in the background, only when the engine has nothing else to
    do (llama.vim sends a warm-up every second; none may delay a real completion)."""
    if not ctx.worker.idle or not (body.input_extra or body.input_prefix or body.input_suffix):
        return
    job = warm_job(lambda: ctx.models.engine_for(model), body.input_prefix, body.input_suffix,
                   body.prompt, files, body.fim_lines)
    try:
        ctx.worker.submit(job, "low")
    except Exception:  # busy or stopping: warming is only ever a hint
        return


@router.post("/infill", response_model=None)
async def infill(body: InfillRequest, request: Request,
                 ctx: Ctx
                 ) -> Response | dict[str, Any] | list[dict[str, Any]]:
    model = ctx.models.require(body.model)
    engine = model.engine
    count = _check(body)
    files = [FimFile(e.filename or "untitled", e.text) for e in body.input_extra]
    if body.n_predict == 0:
        _warm(ctx, model, body, files)
        return select_fields(_warm_body(model), body.response_fields)
    prompts = []
    for index in range(count):
        options = llama_options(body, model, seed_offset=index, code=True)
        fitted = await asyncio.to_thread(build_infill, engine, body.input_prefix,
                                         body.input_suffix, body.prompt, files, options,
                                         body.fim_lines)
        prompts.append((fitted.request, fitted))
    return await _run(ctx, request, model, body, prompts)


@router.post("/completion", response_model=None)
async def completion(body: LlamaCompletionRequest, request: Request,
                     ctx: Ctx
                     ) -> Response | dict[str, Any] | list[dict[str, Any]]:
    model = ctx.models.require(body.model)
    count = _check(body)
    if body.n_predict == 0:
        return select_fields(_warm_body(model), body.response_fields)
    prompts: list[tuple[GenerateRequest, InfillPrompt | None]] = []
    for index in range(count):
        options = llama_options(body, model, seed_offset=index)
        if isinstance(body.prompt, str):
            gen = GenerateRequest(prompt=body.prompt, options=options)
        else:
            gen = GenerateRequest(token_ids=tuple(body.prompt), options=options)
        prompts.append((gen, None))
    return await _run(ctx, request, model, body, prompts)


#: This worker's field names as llama.cpp's /props spells them.
_PROPS_NAMES = {"repetition_penalty": "repeat_penalty", "max_tokens": "n_predict"}


@router.get("/props")
async def props(ctx: Ctx) -> dict[str, Any]:
    model = ctx.models.require(None)
    engine = model.engine
    table = model.sampling.table("llamacpp")
    params: dict[str, Any] = {"n_predict": -1, "seed": -1}
    params.update({_PROPS_NAMES.get(k, k): v["value"] for k, v in table.items()})
    return {"default_generation_settings": {
                "n_ctx": engine.context_length, "model": model.id, "params": params,
                # where each value comes from (the user's preset, the model's configs,
                # llama.cpp's defaults); "infill": what /infill leaves out gets
                "sampling": table, "infill": model.sampling.table("llamacpp", code=True)},
            "total_slots": 1, "model_path": str(model.path), "model_alias": model.id,
            "has_chat_template": engine.tokenizer.has_chat_template,
            "infill": True,
            "fim_family": engine.fim_family.name if engine.fim_family else None,
            "fim_layout": fim_layout(engine.fim_family, engine.tokenizer),
            "modalities": {"vision": False, "audio": False},
            # whether the engine's own attention kernel runs, and why not (engine.kernels)
            "engine_kernels": None if engine.kernel_use is None
            else engine.kernel_use.as_dict(),
            # the weights' move onto huge pages after the load (engine.runtime.hugepages):
            # "pending" while it waits for pauses between requests, None where not done
            "huge_pages": engine.describe()["huge_pages"],
            "build_info": "onnx-local-llm worker"}


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, ctx: Ctx
                   ) -> dict[str, Any]:
    tokenizer = ctx.models.require(None).engine.tokenizer
    ids = await asyncio.to_thread(tokenizer.encode, body.content,
                                  parse_special=body.parse_special, add_bos=body.add_special)
    if not body.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": tokenizer.decode([t])} for t in ids]}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, ctx: Ctx
                     ) -> dict[str, Any]:
    tokenizer = ctx.models.require(None).engine.tokenizer
    bad = [t for t in body.tokens if t >= tokenizer.vocab_size]
    if bad:
        raise ApiError(400, f"tokens: ids {bad[:5]} are outside the vocabulary "
                       f"(0..{tokenizer.vocab_size - 1})", param="tokens")
    return {"content": tokenizer.decode(body.tokens)}


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, ctx: Ctx
                         ) -> dict[str, Any]:
    tokenizer = ctx.models.require(None).engine.tokenizer
    messages = [ChatMessage(m.role, m.content if isinstance(m.content, str) else
                            "".join(p.text or "" for p in m.content or [])) for m in body.messages]
    return {"prompt": tokenizer.apply_chat_template(messages, add_generation_prompt=True)}
