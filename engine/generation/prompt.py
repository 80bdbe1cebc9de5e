"""A request's prompt as token ids, the ids that end it, and FIM requests in the model's
layout: the text stage of a request, before any KV or runner is involved."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from engine.api import GenerateRequest
from engine.config import GenerateOptions
from engine.errors import InvalidPromptError
from engine.generation.fim_plain import FimLines, prefix_only_request
from engine.text.fim import FimFile, FimOrder, build_fim_ids, detect_fim_family, fim_stop_token_ids
from engine.text.tokenizer import Tokenizer

#: Special tokens that end a chat turn in the common templates.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def encode_request(tokenizer: Tokenizer, request: GenerateRequest, vocab_size: int) -> list[int]:
    """The request's prompt ids: its own ids (checked against the vocabulary), its chat
    messages through the template, or its raw text (BOS first when the tokenizer adds one by
    default, as Hugging Face, onnxruntime-genai and llama.cpp do)."""
    if request.token_ids is not None:
        ids = list(request.token_ids)
        bad = [] if not ids or (min(ids) >= 0 and max(ids) < vocab_size) else [
            t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidPromptError(
                f"token ids {bad[:5]} are outside the vocabulary (0..{vocab_size - 1})",
                hint="encode the prompt with this model's tokenizer")
    elif request.messages is not None:
        ids = tokenizer.encode_chat(request.messages, add_generation_prompt=True,
                                    tools=request.tools, extra=request.chat_template_kwargs)
    else:
        assert request.prompt is not None
        ids = tokenizer.encode(request.prompt, parse_special=True,
                               add_bos=tokenizer.adds_bos_by_default)
    if not ids:
        raise InvalidPromptError("the prompt is empty",
                                 hint="give at least one token of prompt text")
    return ids


def stop_ids(tokenizer: Tokenizer, request: GenerateRequest,
             eos_token_ids: Sequence[int]) -> tuple[int, ...]:
    """The token ids that end this request: its own, else the model's EOS ids (plus the
    end-of-turn tokens of chat templates for chat requests)."""
    if request.options.eos_token_ids is not None:
        return request.options.eos_token_ids
    if request.messages is None:
        return tuple(eos_token_ids)
    extra = (tokenizer.token_to_id(t) for t in END_OF_TURN)
    return tuple(dict.fromkeys([*eos_token_ids, *(t for t in extra if t is not None)]))


def fim_request(tokenizer: Tokenizer, prefix: str, suffix: str, options: GenerateOptions, *,
                max_total: int, eos_token_ids: Sequence[int], order: FimOrder | None = None,
                extra_files: Sequence[FimFile] = (), repo_name: str | None = None,
                file_path: str | None = None, lines: FimLines = "auto",
                budget: int | None = None) -> GenerateRequest:
    """See :meth:`engine.Engine.fim_request`: the model's FIM tokens in its declared order
    (FIM stop tokens added to its end ids), else the prefix-only layout."""
    family = detect_fim_family(tokenizer)
    if family is None:
        return prefix_only_request(tokenizer, prefix, suffix, options, max_total=max_total,
                                   eos_token_ids=tuple(eos_token_ids),
                                   extra_files=extra_files, lines=lines, budget=budget)
    order = order or ("spm" if tokenizer.fim_order == "spm" else "psm")
    ids = build_fim_ids(tokenizer, family, prefix, suffix, order=order,
                        extra_files=extra_files, repo_name=repo_name, file_path=file_path)
    if options.eos_token_ids is None:
        stops = dict.fromkeys([*eos_token_ids, *fim_stop_token_ids(family)])
        options = replace(options, eos_token_ids=tuple(stops))
    return GenerateRequest(token_ids=tuple(ids), options=options)
